/*
 * generate: stream text from a GGUF model with libm40llm.
 *
 *   generate MODEL "prompt" [-n N] [--temp T] [--seed S] [-t THREADS] [-c CTX] [--device D]
 *
 * Prints the generated text as it comes, then a line with the prompt and
 * generation speeds in tokens per second.
 */
#define _POSIX_C_SOURCE 200809L
#include "m40llm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct progress {
    double start, first_piece, last_piece;
    unsigned pieces;
};

static bool on_piece(void *user_data, const char *piece, size_t len, m40_token token) {
    (void)token;
    struct progress *p = user_data;
    p->last_piece = now_seconds();
    if (p->pieces++ == 0)
        p->first_piece = p->last_piece;
    fwrite(piece, 1, len, stdout);
    fflush(stdout);
    return true;
}

static void usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s MODEL \"prompt\" [-n N] [--temp T] [--seed S] [-t THREADS] [-c CTX] [--device D]\n"
            "  -n N        tokens to generate (default 128)\n"
            "  --temp T    sampling temperature, 0 for greedy (default 0.8)\n"
            "  --seed S    random seed (default 0)\n"
            "  -t THREADS  CPU threads (default: one per core)\n"
            "  -c CTX      context size in tokens (default: min(training context, 4096))\n"
            "  --device D  -1 for the CPU, 0.. for a CUDA device (default: CUDA 0 if usable)\n",
            argv0);
}

static int parse_number(const char *flag, const char *value, double *out) {
    char *end = NULL;
    if (value == NULL)
        return fprintf(stderr, "%s needs a value\n", flag), 0;
    *out = strtod(value, &end);
    if (end == value || *end != '\0')
        return fprintf(stderr, "%s: '%s' is not a number\n", flag, value), 0;
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        usage(argv[0]);
        return 2;
    }
    const char *model_path = argv[1], *prompt = argv[2];
    m40_model_params model_params = m40_model_default_params();
    m40_session_params session_params = m40_session_default_params();
    m40_sampler_params sampler = m40_sampler_default_params();
    double n_predict = 128;
    for (int i = 3; i < argc; i++) {
        double v;
        const char *flag = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!parse_number(flag, value, &v)) {
            usage(argv[0]);
            return 2;
        }
        if (strcmp(flag, "-n") == 0) n_predict = v;
        else if (strcmp(flag, "--temp") == 0) sampler.temperature = (float)v;
        else if (strcmp(flag, "--seed") == 0) sampler.seed = (uint64_t)v;
        else if (strcmp(flag, "-t") == 0) model_params.n_threads = (uint32_t)v;
        else if (strcmp(flag, "-c") == 0) session_params.n_ctx = (uint32_t)v;
        else if (strcmp(flag, "--device") == 0) model_params.device = (int32_t)v;
        else {
            fprintf(stderr, "unknown option %s\n", flag);
            usage(argv[0]);
            return 2;
        }
        i++;
    }

    m40_model *model = NULL;
    if (m40_model_load(model_path, &model_params, &model) != M40_OK) {
        fprintf(stderr, "error: %s\n", m40_last_error());
        return 1;
    }
    m40_session *session = NULL;
    if (m40_session_new(model, &session_params, &session) != M40_OK) {
        fprintf(stderr, "error: %s\n", m40_last_error());
        m40_free(model);
        return 1;
    }
    size_t n_prompt = 0;
    m40_tokenize(model, prompt, strlen(prompt), true, true, NULL, 0, &n_prompt);

    struct progress p = {now_seconds(), 0, 0, 0};
    fputs(prompt, stdout);
    m40_status st = m40_generate(session, prompt, strlen(prompt), &sampler, (uint32_t)n_predict, on_piece, &p);
    double end = now_seconds();
    putchar('\n');
    fflush(stdout);
    if (st != M40_OK)
        fprintf(stderr, "error: %s\n", m40_last_error());
    double prompt_s = (p.pieces ? p.first_piece : end) - p.start;
    double gen_s = p.pieces > 1 ? p.last_piece - p.first_piece : 0;
    fprintf(stderr, "prompt: %zu tokens, %.1f tokens/s | generation: %u tokens, %.1f tokens/s\n", n_prompt,
            prompt_s > 0 ? (double)n_prompt / prompt_s : 0.0, p.pieces,
            gen_s > 0 ? (double)(p.pieces - 1) / gen_s : 0.0);
    m40_free(session);
    m40_free(model);
    return st == M40_OK ? 0 : 1;
}
