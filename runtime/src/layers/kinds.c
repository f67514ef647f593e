/* The layer-kind table (kinds.h): one row per kind. Adding a kind adds a row here. */
#include "kinds.h"

static const colibri_layer_kind mixers[] = {
    {COLIBRI_MIXER_ATTENTION, "attention", colibri_attention_validate, colibri_attention_tensor,
     colibri_attention_cache, colibri_attention_forward, 1},
    {COLIBRI_MIXER_SLIDING_ATTENTION, "sliding_attention", colibri_sliding_validate,
     colibri_attention_tensor, colibri_sliding_cache, colibri_attention_forward, 1},
    /* several sequences a pass: its forward walks bt->seqs, each with its own state */
    {COLIBRI_MIXER_GATED_DELTANET, "gated_deltanet", colibri_deltanet_validate,
     colibri_deltanet_tensor, colibri_deltanet_cache, colibri_deltanet_forward, 1},
};

static const colibri_layer_kind ffns[] = {
    {COLIBRI_FFN_MOE, "moe", colibri_moe_validate, colibri_moe_tensor, colibri_moe_cache,
     colibri_moe_forward, 1},
};

static const colibri_layer_kind *find(const colibri_layer_kind *t, size_t n, uint32_t kind) {
    for (size_t i = 0; i < n; i++)
        if (t[i].kind == kind) return &t[i];
    return NULL;
}

const colibri_layer_kind *colibri_mixer_kind(uint32_t kind) {
    return find(mixers, sizeof mixers / sizeof mixers[0], kind);
}

const colibri_layer_kind *colibri_ffn_kind(uint32_t kind) {
    return find(ffns, sizeof ffns / sizeof ffns[0], kind);
}
