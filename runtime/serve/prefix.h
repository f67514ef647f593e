/* Prompt prefix reuse (issue 26; docs/serve.md, "Prompt prefix cache"): snapshots of computed
 * sequences (colibri_seq_save: every layer's K/V rows and recurrent state), keyed by the token
 * ids they hold, so a request whose prompt starts with one restores it instead of computing the
 * shared prefix again (a system prompt, the chat template's head, an earlier turn). The bits are
 * those of computing it again (colibri_seq_restore). Bounded in bytes, least recently used out
 * first; warm prompts (--warm-system / --warm-prompt, the profile's service.warm_prompts) are
 * pinned. Its own mutex; never held with the pool's or the server's. */
#ifndef COLIBRI_SERVE_PREFIX_H
#define COLIBRI_SERVE_PREFIX_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "colibri.h"

/* A shared prefix worth its own snapshot on a model that restores a snapshot to its own position
 * only (sliding windows, recurrent layers): at least this many tokens. */
#define PREFIX_MIN_SPLIT 32

typedef struct {
    int32_t *ids;               /* the positions it holds: ids[0..n) */
    int n;
    void *snap;                 /* colibri_seq_save's bytes */
    size_t bytes;
    uint64_t used;              /* LRU clock */
    int pinned;                 /* a warm prompt: never evicted */
    int readers;                /* slots whose context reads snap in place (prefix_restore):
                                   never dropped while above 0 */
} prefix_entry;

typedef struct {
    pthread_mutex_t mu;
    prefix_entry *e;
    int n, cap;
    size_t bytes, limit;        /* held, allowed (snapshots + ids) */
    uint64_t clock;
    int truncate;               /* colibri_model_can_truncate: any prefix of a snapshot restores */
    unsigned long long hits, misses, tokens_saved, evictions;
} prefix_cache;

void prefix_init(prefix_cache *pc, size_t limit, int truncate);
void prefix_free(prefix_cache *pc);

/* Give ctx the longest cached prefix of ids[0..n) (at most n - 1 ids, so one is left to
 * compute the first token's logits). Returns its length (0: none; ctx untouched). *split: when
 * another snapshot shares a longer prefix that this model cannot restore part of, that length
 * (>= PREFIX_MIN_SPLIT; a point worth snapshotting on the way), else 0. Counts a hit or a miss.
 * The full-attention layers read the entry's rows in place (colibri_seq_share: no copy, and
 * slots sharing a system prompt read its rows once a pass from memory); *held is then the
 * entry's snapshot, kept from eviction until prefix_release. */
int prefix_restore(prefix_cache *pc, colibri_ctx *ctx, const int32_t *ids, int n, int *split,
                   const void **held);

/* The request is over: ctx lets go of the snapshot *held (colibri_reset: its next request
 * restores or starts afresh anyway), which may be evicted again; *held = NULL. None held: nothing. */
void prefix_release(prefix_cache *pc, colibri_ctx *ctx, const void **held);

/* Snapshot ctx, whose position is n and whose positions hold ids[0..n), unless an entry holds
 * it already; evicts the least recently used unpinned entries to make room. 0 when stored or
 * already held, -1 when it does not fit (pinned: the caller reports it) or memory ran out. */
int prefix_insert(prefix_cache *pc, colibri_ctx *ctx, const int32_t *ids, int n, int pinned);

typedef struct {
    int entries, readers;       /* readers: slots reading an entry in place now */
    size_t bytes, limit;
    unsigned long long hits, misses, tokens_saved, evictions;
} prefix_stats;

void prefix_get_stats(prefix_cache *pc, prefix_stats *s);

#endif
