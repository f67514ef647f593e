/* What every layer kind shares: weight matrices applied to groups of token rows as one parallel
 * job over the context's pool, and RMSNorm.
 *
 * A job is a list of segments (one weight matrix each); every thread takes a fixed slice of each
 * segment's output rows, and each output value is computed start to finish by one thread, so the
 * results are bitwise identical for any thread count. */
#ifndef COLIBRI_LAYERS_LINEAR_H
#define COLIBRI_LAYERS_LINEAR_H

#include <stddef.h>
#include <stdint.h>

#include "colibri_config.h"
#include "core/context.h"

/* One weight matrix applied to a group of token rows: y[j, r] = W[r, :] . x[j, :]. */
typedef struct {
    const colibri_tensor *w;
    const float *x;
    size_t ldx;
    const int8_t *xq; /* int8 activations instead of x (int8 weights with use_q8) */
    int a8;           /* mxfp4 weights with --int8-act: the kernel quantises x per block itself */
    const float *xqs;
    size_t ldq;
    int n;
    float *y;
    size_t ldy;
} colibri_mm_seg;

typedef struct {
    colibri_ctx *ctx;
    int nseg;
    colibri_mm_seg seg[2 * COLIBRI_MAX_EXPERTS + 4];
} colibri_mm_job;

/* An empty job. Not `= {.ctx = ctx}`: that would zero every segment slot (74 KiB with 512
 * experts) on each of a layer's jobs, a measurable share of a small model's decode. */
static inline void colibri_mm_init(colibri_mm_job *job, colibri_ctx *ctx) {
    job->ctx = ctx;
    job->nseg = 0;
}

/* Add a segment: n rows of x (stride ldx) through w into y (stride ldy). With int8 activations
 * (ctx->use_q8 and int8/q4 weights) its input rows are quantised into xq rows [qrow, qrow + n)
 * here, so segments that run in the same job need disjoint qrow ranges. */
void colibri_mm_add(colibri_mm_job *job, const colibri_tensor *w, const float *x, size_t ldx,
                    int n, float *y, size_t ldy, size_t qrow);

/* Run every segment of the job on the pool (the caller's thread included). */
void colibri_mm_run(colibri_mm_job *job);

/* out[i] = w[i] * x[i] / sqrt(mean_{j<d} x[j]^2 + eps) for i < n (n >= d; lanes past d are
 * padding). The sum is in double, in index order. */
void colibri_rmsnorm(float *out, const float *x, const float *w, size_t d, size_t n, float eps);

#endif
