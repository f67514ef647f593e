/* RoPE frequencies and tables (rope.h).
 *
 * Plain RoPE: pair i turns at theta^(-2i/Dh). YaRN (gpt-oss) blends, per pair, the plain
 * frequency ("extrapolation") with it divided by `factor` ("interpolation") along a linear ramp
 * between two pair indices found from the rotations beta_fast and beta_slow make over the
 * original context, and multiplies cos and sin by the attention factor. This is transformers'
 * _compute_yarn_parameters (modeling_rope_utils.py) step by step, in double; its cos and sin are
 * then scaled in float as GptOssRotaryEmbedding.forward does (cos() * attention_scaling). */
#include "rope.h"

#include <math.h>
#include <stdlib.h>

#include "le.h" /* fail() */

static const double PI = 3.14159265358979323846;

colibri_status colibri_rope_check_yarn(const struct colibri_yarn *y, char *why, size_t len) {
    const char *names[] = {"factor", "beta_fast", "beta_slow", "attention_factor"};
    float vals[] = {y->factor, y->beta_fast, y->beta_slow, y->attention_factor};
    for (int i = 0; i < 4; i++)
        if (!(isfinite(vals[i]) && vals[i] > 0.0f))
            return fail(why, len, COLIBRI_E_ABSURD_DIM,
                        "header field rope.yarn.%s = %g is not finite and > 0", names[i],
                        (double)vals[i]);
    if (y->original < 1)
        return fail(why, len, COLIBRI_E_ABSURD_DIM,
                    "header field rope.yarn.original_max_position = 0, must be at least 1");
    if (y->truncate > 1)
        return fail(why, len, COLIBRI_E_ABSURD_DIM,
                    "header field rope.yarn.truncate = %u, must be 0 or 1", y->truncate);
    return COLIBRI_OK;
}

/* find_correction_dim: the pair index whose wavelength makes `rotations` turns over the
 * original context */
static double correction_dim(double rotations, double dim, double base, double original) {
    return dim * log(original / (rotations * 2.0 * PI)) / (2.0 * log(base));
}

colibri_status colibri_rope_setup(struct colibri_rope *r, uint32_t head_dim, float theta,
                                  const struct colibri_yarn *yarn, char *why, size_t len) {
    size_t half = head_dim / 2;
    r->head_dim = head_dim;
    r->freq = malloc(half * sizeof *r->freq);
    if (!r->freq) return fail(why, len, COLIBRI_E_NO_MEMORY, "out of memory for the RoPE table");
    r->scale = 1.0f;
    double dim = (double)head_dim, base = (double)theta;
    for (size_t i = 0; i < half; i++) r->freq[i] = pow(base, -2.0 * (double)i / dim);
    if (!yarn) return COLIBRI_OK;
    double factor = yarn->factor, orig = yarn->original;
    double low = correction_dim(yarn->beta_fast, dim, base, orig);
    double high = correction_dim(yarn->beta_slow, dim, base, orig);
    if (yarn->truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0.0) low = 0.0;
    if (high > dim - 1.0) high = dim - 1.0;
    if (low == high) high += 0.001; /* transformers: "prevent singularity" */
    for (size_t i = 0; i < half; i++) {
        double extrapolation = r->freq[i], interpolation = extrapolation / factor;
        double ramp = ((double)i - low) / (high - low);
        ramp = ramp < 0.0 ? 0.0 : ramp > 1.0 ? 1.0 : ramp;
        double keep = 1.0 - ramp; /* the share of the plain frequency */
        r->freq[i] = interpolation * (1.0 - keep) + extrapolation * keep;
    }
    r->scale = yarn->attention_factor;
    return COLIBRI_OK;
}

void colibri_rope_free(struct colibri_rope *r) {
    free(r->freq);
    r->freq = NULL;
}

void colibri_rope_row(const struct colibri_rope *r, int32_t p, float *cs) {
    size_t half = r->head_dim / 2;
    for (size_t i = 0; i < half; i++) {
        double a = (double)p * r->freq[i];
        cs[i] = (float)cos(a);
        cs[half + i] = (float)sin(a);
    }
    if (r->scale != 1.0f)
        for (size_t i = 0; i < 2 * half; i++) cs[i] *= r->scale;
}
