/* colibri: command-line front end of the runtime. (Minimal placeholder: --version only; the
 * runtime work replaces it with info/forward/generate/bench/selftest.) */
#include <stdio.h>
#include <string.h>

#include "colibri_config.h"

#define STR2(x) #x
#define STR(x) STR2(x)

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--version") == 0) {
        printf("colibri 0.1.0 target=%s\n", COLIBRI_TARGET_NAME);
        printf("COLIBRI_EMBED_DIM_PAD=%d COLIBRI_STREAM_COUNT=%d COLIBRI_ROUTING_MODE=%s "
               "COLIBRI_TOP_K=%d COLIBRI_MAX_EXPERTS=%d profile=%s\n",
               COLIBRI_EMBED_DIM_PAD, COLIBRI_STREAM_COUNT, STR(COLIBRI_ROUTING_MODE), COLIBRI_TOP_K,
               COLIBRI_MAX_EXPERTS, COLIBRI_PROFILE_HASH);
        return 0;
    }
    fprintf(stderr, "usage: colibri --version\n");
    return 2;
}
