/* The prompt prefix cache (prefix.h). A few entries (the byte budget bounds them), each looked at
 * in full: the longest common prefix of its ids with a prompt. */
#include "prefix.h"

#include <stdlib.h>
#include <string.h>

void prefix_init(prefix_cache *pc, size_t limit, int truncate) {
    memset(pc, 0, sizeof *pc);
    pthread_mutex_init(&pc->mu, NULL);
    pc->limit = limit;
    pc->truncate = truncate;
}

static void drop(prefix_cache *pc, int i) {
    prefix_entry *e = &pc->e[i];
    pc->bytes -= e->bytes + (size_t)e->n * sizeof(int32_t);
    free(e->ids);
    free(e->snap);
    pc->e[i] = pc->e[--pc->n];
}

void prefix_free(prefix_cache *pc) {
    while (pc->n) drop(pc, pc->n - 1);
    free(pc->e);
    pc->e = NULL;
    pthread_mutex_destroy(&pc->mu);
}

static int common(const int32_t *a, int na, const int32_t *b, int nb) {
    int i = 0, n = na < nb ? na : nb;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* Under mu: how many of ids[0..n) entry e can give (all it shares, or on a model that restores
 * only whole snapshots, all of it or nothing). */
static int usable(const prefix_cache *pc, const prefix_entry *e, int shared) {
    return pc->truncate || shared == e->n ? shared : 0;
}

int prefix_restore(prefix_cache *pc, colibri_ctx *ctx, const int32_t *ids, int n, int *split,
                   const void **held) {
    *split = 0;
    *held = NULL;
    if (!pc->limit) return 0;
    pthread_mutex_lock(&pc->mu);
    int best = -1, got = 0, longest = 0;
    for (int i = 0; i < pc->n; i++) {
        int shared = common(pc->e[i].ids, pc->e[i].n, ids, n - 1);
        int u = usable(pc, &pc->e[i], shared);
        if (u > got) got = u, best = i;
        if (shared > longest) longest = shared;
    }
    /* under the lock: an entry is never freed while it is copied, and is counted as read in
     * place before the lock is let go */
    if (best >= 0 && colibri_seq_share(ctx, pc->e[best].snap, pc->e[best].bytes, got) == COLIBRI_OK) {
        pc->hits++;
        pc->tokens_saved += (unsigned long long)got;
        pc->e[best].used = ++pc->clock;
        pc->e[best].readers++;
        *held = pc->e[best].snap;
    } else {
        got = 0;
        pc->misses++;
    }
    if (!pc->truncate && longest > got && longest >= PREFIX_MIN_SPLIT) *split = longest;
    pthread_mutex_unlock(&pc->mu);
    return got;
}

void prefix_release(prefix_cache *pc, colibri_ctx *ctx, const void **held) {
    if (!*held) return;
    colibri_reset(ctx); /* before the count falls: from then on the entry may be freed */
    pthread_mutex_lock(&pc->mu);
    for (int i = 0; i < pc->n; i++)
        if (pc->e[i].snap == *held) {
            pc->e[i].readers--;
            break;
        }
    pthread_mutex_unlock(&pc->mu);
    *held = NULL;
}

/* Under mu: an entry that already gives all of ids[0..n), or -1. */
static int holder(const prefix_cache *pc, const int32_t *ids, int n) {
    for (int i = 0; i < pc->n; i++) {
        const prefix_entry *e = &pc->e[i];
        if (e->n >= n && (pc->truncate || e->n == n) && common(e->ids, e->n, ids, n) == n) return i;
    }
    return -1;
}

int prefix_insert(prefix_cache *pc, colibri_ctx *ctx, const int32_t *ids, int n, int pinned) {
    if (!pc->limit || n < 1) return -1;
    pthread_mutex_lock(&pc->mu);
    int h = holder(pc, ids, n);
    if (h >= 0) {
        pc->e[h].used = ++pc->clock;
        pc->e[h].pinned |= pinned;
    }
    pthread_mutex_unlock(&pc->mu);
    if (h >= 0) return 0;
    size_t bytes = colibri_seq_state_bytes(ctx), cost = bytes + (size_t)n * sizeof(int32_t);
    if (!bytes || cost > pc->limit) return -1;
    prefix_entry ne = {malloc((size_t)n * sizeof(int32_t)), n, malloc(bytes), bytes, 0, pinned, 0};
    size_t len = 0;
    if (!ne.ids || !ne.snap || colibri_seq_save(ctx, ne.snap, bytes, &len) != COLIBRI_OK) {
        free(ne.ids);
        free(ne.snap);
        return -1;
    }
    memcpy(ne.ids, ids, (size_t)n * sizeof(int32_t));
    pthread_mutex_lock(&pc->mu);
    int rc = 0;
    if ((h = holder(pc, ids, n)) >= 0) { /* another request stored it meanwhile */
        pc->e[h].pinned |= pinned;
        rc = 1;
    }
    /* on a model that restores any prefix of a snapshot, the new one covers its own prefixes */
    for (int i = 0; !rc && pc->truncate && i < pc->n;)
        if (!pc->e[i].pinned && !pc->e[i].readers && pc->e[i].n <= n &&
            common(pc->e[i].ids, pc->e[i].n, ids, n) == pc->e[i].n)
            drop(pc, i);
        else
            i++;
    while (!rc && pc->bytes + cost > pc->limit) { /* least recently used, unpinned, unread, out first */
        int lru = -1;
        for (int i = 0; i < pc->n; i++)
            if (!pc->e[i].pinned && !pc->e[i].readers && (lru < 0 || pc->e[i].used < pc->e[lru].used))
                lru = i;
        if (lru < 0) {
            rc = -1;
            break;
        }
        drop(pc, lru);
        pc->evictions++;
    }
    if (!rc && pc->n == pc->cap) {
        int cap = pc->cap ? 2 * pc->cap : 8;
        prefix_entry *e = realloc(pc->e, (size_t)cap * sizeof *e);
        if (e) {
            pc->e = e;
            pc->cap = cap;
        } else {
            rc = -1;
        }
    }
    if (!rc) {
        ne.used = ++pc->clock;
        pc->e[pc->n++] = ne;
        pc->bytes += cost;
    }
    pthread_mutex_unlock(&pc->mu);
    if (rc) {
        free(ne.ids);
        free(ne.snap);
    }
    return rc < 0 ? -1 : 0;
}

void prefix_get_stats(prefix_cache *pc, prefix_stats *s) {
    pthread_mutex_lock(&pc->mu);
    int readers = 0;
    for (int i = 0; i < pc->n; i++) readers += pc->e[i].readers;
    *s = (prefix_stats){pc->n, readers, pc->bytes, pc->limit, pc->hits, pc->misses,
                        pc->tokens_saved, pc->evictions};
    pthread_mutex_unlock(&pc->mu);
}
