/* Matrix jobs and RMSNorm shared by the layer kinds (linear.h). */
#include "linear.h"

#include <math.h>
#include <string.h>

#include "cpu/kernels.h"
#include "cpu/kernels_mxfp4.h"
#include "cpu/q4_pack.h"

static void mm_task(void *arg, int t, int nt) {
    colibri_mm_job *job = arg;
    colibri_buffers *b = &job->ctx->b;
    float *scratch = b->scratch + (size_t)t * 2 * b->max_cols;
    for (int s = 0; s < job->nseg; s++) {
        const colibri_mm_seg *g = &job->seg[s];
        unsigned long lo, hi;
        /* the int8-activation kernels read the packed layout (cpu/q4_pack.h) if this context may */
        int packed = g->w->packed && (g->xq || g->a8);
        if (packed && job->ctx->q4_packed) {
            /* the packed kernels' unit is a 16-row block: split at block edges (a row's value
             * does not depend on the split) */
            colibri_split(g->w->rows / COLIBRI_Q4P_ROWS, t, nt, &lo, &hi);
            lo *= COLIBRI_Q4P_ROWS;
            hi *= COLIBRI_Q4P_ROWS;
        } else {
            colibri_split(g->w->rows, t, nt, &lo, &hi);
        }
        if (lo == hi) continue;
        colibri_tensor file;
        const colibri_tensor *w = g->w;
        if (packed && !job->ctx->q4_packed) { /* this context reads the file's layout */
            file = *g->w;
            file.packed = NULL;
            w = &file;
        }
        if (g->a8)
            colibri_mxfp4_rows_dot_a8(w, (uint32_t)lo, (uint32_t)hi, g->x, g->n, g->ldx, g->y, g->ldy);
        else if (g->xq)
            colibri_rows_dot_q8(w, (uint32_t)lo, (uint32_t)hi, g->xq, g->xqs, g->n, g->ldq, g->y,
                                g->ldy);
        else
            colibri_rows_dot(g->w, (uint32_t)lo, (uint32_t)hi, g->x, g->n, g->ldx, g->y, g->ldy,
                             scratch);
    }
}

void colibri_mm_add(colibri_mm_job *job, const colibri_tensor *w, const float *x, size_t ldx,
                    int n, float *y, size_t ldy, size_t qrow) {
    colibri_ctx *ctx = job->ctx;
    colibri_mm_seg *g = &job->seg[job->nseg++];
    memset(g, 0, sizeof *g);
    g->w = w;
    g->x = x;
    g->ldx = ldx;
    g->n = n;
    g->y = y;
    g->ldy = ldy;
    g->a8 = ctx->mx_a8 && w->dtype == COLIBRI_DT_MXFP4;
    if (ctx->use_q8 && (w->dtype == COLIBRI_DT_INT8 || w->dtype == COLIBRI_DT_Q4) && n > 0) {
        colibri_buffers *b = &ctx->b;
        g->ldq = b->max_cols;
        g->xq = b->xq + qrow * g->ldq;
        g->xqs = b->xqs + qrow;
        for (int j = 0; j < n; j++)
            colibri_quantize_row(x + (size_t)j * ldx, w->cols, b->xq + (qrow + (size_t)j) * g->ldq,
                                 b->xqs + qrow + (size_t)j);
    }
}

void colibri_mm_run(colibri_mm_job *job) { colibri_pool_run(&job->ctx->pool, mm_task, job); }

void colibri_rmsnorm(float *out, const float *x, const float *w, size_t d, size_t n, float eps) {
    double ss = 0.0;
    for (size_t i = 0; i < d; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
    for (size_t i = 0; i < n; i++) out[i] = w[i] * (x[i] * inv);
}
