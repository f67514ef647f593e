/* What the colibri CLI's subcommands (the tools/ directory) share: the global options (one
 * parser, one struct), the command table's row type, number and id-list parsing, a monotonic
 * clock, JSON string output and opening a context with a one-line error. */
#ifndef COLIBRI_TOOLS_CLI_H
#define COLIBRI_TOOLS_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "colibri.h"

/* The options every command takes, before or after the command word (docs/runtime.md, "CLI"). */
typedef struct {
    colibri_backend backend;
    int backend_given;       /* a command with another default (bench-contexts: cpu) keeps it */
    int threads;             /* 0: not given (the command's default: online CPUs, or per command) */
    int int8_act;
    int q4_file_layout;      /* --q4-file-layout */
    colibri_kv_dtype kv;
    /* real-time mode (docs/runtime.md, "Real-time mode") */
    int cpus[64];            /* --cpus: the workers' CPUs in order */
    int n_cpus;
    colibri_sched sched;     /* --sched other|fifo:N|rr:N */
    int sched_priority;
    int lock_memory;         /* --mlock */
    colibri_barrier barrier; /* --barrier sleep|spin */
} cli_globals;

#define CLI_GLOBAL_OPTIONS "[--backend cpu|cuda|auto] [--threads N] [--int8-act] [--q4-file-layout] [--kv-cache f32|f16] " \
    "[--cpus LIST] [--sched other|fifo:N|rr:N] [--mlock] [--barrier sleep|spin]"
#define CLI_GLOBAL_HELP                                                                          \
    "global options (before or after the command):\n"                                          \
    "  --backend cpu|cuda|auto  auto (default): CUDA when it comes up, else the CPU (the reason\n" \
    "                           is printed); cuda: fail without it\n"                           \
    "  --threads N              CPU threads, 1..64 (default: online CPUs)\n"                     \
    "  --int8-act               int8/q4 weights: int8 activations (integer dot products)\n"      \
    "  --q4-file-layout         q4/mxfp4/int8 weights read in the file's layout only (no packed\n" \
    "                           copy at load; the same bits, slower with --int8-act on AVX-512 VNNI)\n" \
    "  --kv-cache f32|f16       KV cache storage (f16: half the memory)\n"                      \
    "real-time mode (docs/runtime.md; a profile's realtime: section renders them for the unit):\n" \
    "  --cpus LIST              pin worker t to the t-th CPU (\"2-5\", \"4,2,3\"); threads = CPUs\n" \
    "  --sched other|fifo:N|rr:N  the workers' scheduling policy, priority N 1..99\n"           \
    "                           (needs RLIMIT_RTPRIO >= N or CAP_SYS_NICE)\n"                   \
    "  --mlock                  lock and pre-fault the model and the arena at init (needs\n"    \
    "                           RLIMIT_MEMLOCK above their size or CAP_IPC_LOCK)\n"            \
    "  --barrier sleep|spin     between a pass's jobs: spin briefly then sleep (default), or\n" \
    "                           spin while passes keep coming (a core each, no wake-up)\n"

void cli_default_globals(cli_globals *g);

/* If argv[*i] is a global option, take it (and its value: *i moves past it) into g and return
 * 1; 0 when it is not one; -1 when its value is bad or missing (the reason is printed on
 * stderr; the caller prints its usage and exits 2). */
int cli_global(cli_globals *g, int argc, char **argv, int *i);

/* One row of the command table (tools/main.c). run gets the globals parsed before the command
 * word and argv from the command word on (argv[0] is the word); it parses its own options and
 * any global option after the word (cli_global), answers --help with its usage on stdout and
 * exit 0, and returns the exit status (0 ok, 1 failure, 2 usage). */
typedef struct {
    const char *name;
    int (*run)(const cli_globals *g, int argc, char **argv);
    const char *args;    /* what follows the command word, for the general usage */
    const char *summary; /* one line */
} cli_command;

/* "colibri: WHAT: STATUS: DETAIL" on stderr (": DETAIL" only when there is one), so a failure
 * says each thing once. */
void cli_report(const char *what, colibri_status s, const char *detail);

/* Decimal integer in [lo, hi], the whole string (NULL is rejected). 0, or -1 when bad. */
int cli_long(const char *s, long lo, long hi, long *out);

/* A CPU list: comma-separated CPUs and ranges ("2-5,7", "4,2,3"), in the order given, each
 * 0..1023, none twice, at most cap. The count, or -1 when malformed. */
int cli_cpu_list(const char *s, int *out, int cap);

/* "1,2,3" -> *out (malloc'd, the caller frees) and *n. 0, or -1 when a field is not an int32
 * or memory runs out. */
int cli_ids(const char *s, int32_t **out, size_t *n);

/* Milliseconds on the monotonic clock. */
double cli_now_ms(void);

/* The n bytes at s as a JSON string: quote and backslash escaped, control bytes as \u00XX,
 * other bytes as they are. */
void cli_json_string(FILE *f, const char *s, size_t n);

/* colibri_init_ex with these options; on failure prints "colibri: MODEL: STATUS: DETAIL" on
 * stderr and returns 1 (0 on success). */
int cli_open(const char *model, colibri_backend backend, int threads, int int8_act,
             colibri_kv_dtype kv, colibri_ctx **ctx);
/* The same with the global options (real-time mode included). */
int cli_open_globals(const char *model, const cli_globals *g, colibri_ctx **ctx);
/* --mlock: lock every page of the process, present and future (mlockall MCL_CURRENT |
 * MCL_FUTURE), after checking that `model` (may be NULL) fits RLIMIT_MEMLOCK; 0, or 1 after
 * printing why it cannot (the limit and the unit setting that raises it). */
int cli_lock_process(const cli_globals *g, const char *model);
/* The colibri_options the global options say (error buffer not set). */
void cli_options(const cli_globals *g, colibri_options *opt);

/* --kv-cache VALUE: "f32" or "f16". 0, or -1 for anything else (the caller prints the usage). */
int cli_kv_dtype(const char *s, colibri_kv_dtype *out);
#define CLI_KV_USAGE "--kv-cache must be f32 or f16"


#endif
