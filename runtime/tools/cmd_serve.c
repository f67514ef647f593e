/* `colibri serve`: the OpenAI-compatible HTTP service (runtime/serve/server.h, docs/serve.md).
 *
 *   colibri [global options] serve MODEL [--host 127.0.0.1] [--port 8080]
 *           [--slots N] [--max-queue Q] [--api-key-file F] [--model-id NAME]
 *           [--max-body BYTES] [--head-timeout MS] [--read-timeout MS] [--write-timeout MS]
 *           [--drain-timeout MS] [--max-connections N] [--max-connections-per-address N]
 *           [--allow-host NAMES] [--allow-origin ORIGINS] [--no-batching] [--prompt-rows N] [--prefix-cache-mb N]
 *           [--warm-system TEXT]... [--warm-prompt TEXT]... [--warm-prompts-b64 B]
 *
 * Exit status: 0 after SIGTERM/SIGINT and the drain, 1 when the service cannot start (model,
 * key file, address), 2 usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "colibri.h"
#include "../serve/server.h"

/* On stdout for --help, on stderr after a usage error (then exit 2). */
static int serve_usage_to(FILE *f, const char *msg) {
    if (msg) fprintf(stderr, "colibri serve: %s\n", msg);
    fprintf(f,
            "usage: colibri serve MODEL [options]\n"
            "  --host ADDR          address to listen on (default 127.0.0.1; beyond loopback needs --api-key-file)\n"
            "  --port N             TCP port (default 8080; 0 picks a free one, printed in the ready line)\n"
            "  --slots N            concurrent generations, one context (KV cache) each over the shared\n"
            "                       model (default 1); on the CPU one pass per step computes them all\n"
            "  --threads T          compute threads: the CPU engine's, shared by every slot (default:\n"
            "                       online CPUs); with --no-batching or on CUDA, per slot (online CPUs / slots)\n"
            "  --no-batching        each slot runs its own passes (continuous batching is on by default)\n"
            "  --prompt-rows N      while a request decodes, prompts take at most N rows of a step, so\n"
            "                       its next token waits for N prompt rows, not a 512-row pass\n"
            "                       (1..512; default: no cap; the same ids either way)\n"
            "  --prefix-cache-mb N  memory for prompt prefixes kept for reuse (default: one slot's KV\n"
            "                       cache; 0: off)\n"
            "  --warm-system TEXT   a chat system prompt computed at start-up and kept (repeatable)\n"
            "  --warm-prompt TEXT   a completion prompt's text computed at start-up and kept (repeatable)\n"
            "  --warm-prompts-b64 B base64 of a JSON list of {\"system\": TEXT} / {\"prompt\": TEXT}\n"
            "                       (what the systemd unit passes: the profile's service.warm_prompts)\n"
            "  --max-queue Q        requests that may wait for a slot; beyond: 503 + Retry-After (default 16)\n"
            "  --api-key-file F     first line is the key; clients send 'Authorization: Bearer KEY'\n"
            "  --model-id NAME      model name in the API (default: the file name without .colibri)\n"
            "  --max-body BYTES     request body limit (default 1048576)\n"
            "  --head-timeout MS    deadline for a request's head, from the connection (default 5000)\n"
            "  --read-timeout MS    deadline for a request's head and body (default 10000)\n"
            "  --write-timeout MS   drop a client that stops reading for this long (default 30000)\n"
            "  --drain-timeout MS   on SIGTERM, wait this long for in-flight requests (default 30000)\n"
            "  --deadline-ms MS     a request's deadline when it gives no deadline_ms; answers after\n"
            "                       it are counted in /metrics (default: none)\n"
            "  --max-connections N  connections held at once (default 256); beyond, the oldest\n"
            "                       still sending its head is closed to make room\n"
            "  --max-connections-per-address N\n"
            "                       connections from one address (IPv6: one /64) still sending their\n"
            "                       request (default 32); beyond, that address's oldest is closed\n"
            "  --allow-host NAMES   Host names to answer besides loopback ones, comma-separated, or '*'\n"
            "                       (a loopback bind answers only loopback names unless given)\n"
            "  --allow-origin ORIGINS\n"
            "                       browser origins (scheme://host[:port]) allowed, with CORS; others are\n"
            "                       refused with 403 (default: none)\n"
            "Endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,\n"
            "GET /metrics. One JSON log line per request on stderr. Exit 0 after SIGTERM.\n"
            "Here --threads (a global option) is the batch engine's (see above). With --cpus (real-time\n"
            "mode) the list has --slots x --threads CPUs: the batch engine's workers run on all of them;\n"
            "with --no-batching or on CUDA slot i's run on the i-th --threads CPUs of the list.\n"
            CLI_GLOBAL_HELP);
    return 2;
}

static int serve_usage(const char *msg) { return serve_usage_to(stderr, msg); }

/* argv[0] is the word "serve"; g: the global options before it (more may follow). */
int cmd_serve(const cli_globals *g, int argc, char **argv) {
    server_options o;
    server_default_options(&o);
    cli_globals globals = *g;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n;
        int r;
#define VALUE() do { if (!v) return serve_usage("missing value after an option"); i++; } while (0)
#define RANGE(lo, hi, field, what) do { VALUE(); if (cli_long(v, lo, hi, &n)) return serve_usage(what); field = n; } while (0)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { serve_usage_to(stdout, NULL); return 0; }
        else if ((r = cli_global(&globals, argc, argv, &i)) != 0) { if (r < 0) return serve_usage(NULL); }
        else if (!strcmp(a, "--host")) { VALUE(); o.host = v; }
        else if (!strcmp(a, "--port")) RANGE(0, 65535, o.port, "--port must be 0..65535");
        else if (!strcmp(a, "--slots")) RANGE(1, 64, o.slots, "--slots must be 1..64");
        else if (!strcmp(a, "--max-queue")) RANGE(0, 4096, o.max_queue, "--max-queue must be 0..4096");
        else if (!strcmp(a, "--api-key-file")) { VALUE(); o.api_key_file = v; }
        else if (!strcmp(a, "--no-batching")) o.no_batching = 1;
        else if (!strcmp(a, "--prompt-rows")) RANGE(1, 512, o.prompt_rows, "--prompt-rows must be 1..512");
        else if (!strcmp(a, "--prefix-cache-mb")) RANGE(0, 1L << 20, o.prefix_cache_mb, "--prefix-cache-mb must be 0..1048576");
        else if (!strcmp(a, "--warm-system") || !strcmp(a, "--warm-prompt")) {
            VALUE();
            if (!*v) return serve_usage("a warm prompt must not be empty");
            if (o.n_warm >= SERVE_MAX_WARM) return serve_usage("at most 16 warm prompts");
            o.warm[o.n_warm++] = (serve_warm){!strcmp(a, "--warm-system"), v};
        } else if (!strcmp(a, "--warm-prompts-b64")) { VALUE(); o.warm_b64 = v; }
        else if (!strcmp(a, "--model-id")) {
            VALUE();
            if (!*v || strlen(v) > 100) return serve_usage("--model-id must be 1..100 characters");
            o.model_id = v;
        } else if (!strcmp(a, "--max-body")) RANGE(1024, 1L << 30, o.max_body, "--max-body must be 1024..1073741824");
        else if (!strcmp(a, "--head-timeout")) RANGE(10, 3600000, o.head_timeout_ms, "--head-timeout must be 10..3600000 ms");
        else if (!strcmp(a, "--read-timeout")) RANGE(10, 3600000, o.read_timeout_ms, "--read-timeout must be 10..3600000 ms");
        else if (!strcmp(a, "--write-timeout")) RANGE(10, 3600000, o.write_timeout_ms, "--write-timeout must be 10..3600000 ms");
        else if (!strcmp(a, "--drain-timeout")) RANGE(0, 3600000, o.drain_timeout_ms, "--drain-timeout must be 0..3600000 ms");
        else if (!strcmp(a, "--deadline-ms")) RANGE(1, 86400000, o.deadline_ms, "--deadline-ms must be 1..86400000");
        else if (!strcmp(a, "--max-connections")) RANGE(16, 65536, o.max_conns, "--max-connections must be 16..65536");
        else if (!strcmp(a, "--max-connections-per-address"))
            RANGE(1, 65536, o.max_conns_per_addr, "--max-connections-per-address must be 1..65536");
        else if (!strcmp(a, "--allow-host") || !strcmp(a, "--allow-origin")) {
            VALUE();
            int host = !strcmp(a, "--allow-host");
            int *n_list = host ? &o.n_allow_host : &o.n_allow_origin;
            if (*n_list >= SERVE_MAX_ALLOW) return serve_usage("--allow-host / --allow-origin given too often");
            (host ? o.allow_host : o.allow_origin)[(*n_list)++] = v;
        }
        else if (a[0] == '-') {
            fprintf(stderr, "colibri serve: unknown option %s\n", a);
            return serve_usage(NULL);
        } else if (!o.model_path) o.model_path = a;
        else return serve_usage("too many arguments");
#undef RANGE
#undef VALUE
    }
    if (!o.model_path) return serve_usage("MODEL is required");
    o.backend = globals.backend;
    o.threads = globals.threads;
    o.int8_activations = globals.int8_act;
    o.kv_dtype = globals.kv;
    if (globals.n_cpus) { /* real-time mode: every slot gets threads CPUs of the list, in order */
        if (!o.threads && globals.n_cpus % o.slots)
            return serve_usage("--cpus: the slots must share the CPUs evenly (a multiple of --slots)");
        if (!o.threads) o.threads = globals.n_cpus / o.slots;
        if (o.threads * o.slots != globals.n_cpus)
            return serve_usage("--cpus must list --slots x --threads CPUs (one worker thread each)");
        o.cpus = globals.cpus;
        o.n_cpus = globals.n_cpus;
    }
    o.sched = globals.sched;
    o.sched_priority = globals.sched_priority;
    o.lock_memory = globals.lock_memory;
    o.barrier = globals.barrier;
    if (cli_lock_process(&globals, o.model_path)) return 1;
    return server_run(&o); /* threads 0: the pool picks (slots.h, pool_open) */
}
