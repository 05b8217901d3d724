/*
 * m40-bench: speed of libm40llm as a host sees it, through the public C API,
 * reported like llama.cpp's llama-bench so the two read side by side.
 *
 *   m40-bench -m MODEL [-d DEVICE[,DEVICE...] [--ts SHARES]] [-t THREADS]
 *             [-p 512] [-n 128] [-r 5] [-b 1,8,32] [--n-depth 0,2048] [-s]
 *             [--n-batch N] [--json]
 *
 * Several devices (-d 0,1 or -d -1,0) split the model's layers over them in
 * that order (m40_model_load_split), by the shares of --ts (llama-bench's
 * -ts, e.g. 3,1 or 3/1; default: from free memory).
 *
 *   pp N   tokens/s processing an N-token prompt in one m40_decode
 *   tg N   tokens/s generating N tokens, one m40_decode each
 *   tgN@B  aggregate tokens/s of B sessions stepped together N times with
 *          m40_decode_batch (-b; B = 1 is the tg row)
 *   ... @ dD  the same after D tokens of context (--n-depth, llama-bench's
 *          -d; here -d names the device): long contexts, where attention
 *          rather than the weights takes the time. The roofline column
 *          still counts weight bytes only.
 *
 * With -s the tg rows also sample each session's next token (the default
 * sampler: temperature 0.8, top-k 40) and feed it back, every step one
 * m40_decode_batch_sample, named tgN+s / tgN@B+s: the step a server runs,
 * whose logits stay on the device. Without -s each step's tokens are random
 * and its logits come back to the host, as llama.cpp's benchmarks do.
 *
 * Each test runs once to warm up, then -r times; rows show mean ± stddev.
 * The memory bandwidth is measured in the same run (on a CUDA device, the
 * library's device-to-device copy that m40_model_describe reports; on the
 * CPU, a multi-threaded copy here), and each generation row shows the
 * fraction of that roofline it reached:
 * (weight bytes read per step) × steps/s ÷ bandwidth. On a GPU the header
 * also shows the most device memory the runs held at once (weights, KV
 * caches, scratch): `-p 16384 -n 0 -r 1 --n-batch 512` says whether a
 * 16k-token session with the default prompt chunk fits a card.
 */
#define _GNU_SOURCE
#include "m40llm.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what) {
    fprintf(stderr, "m40-bench: %s: %s\n", what, m40_last_error());
    exit(1);
}

/* ---- memory bandwidth: a large copy split over threads ---- */

struct copy_job {
    char *dst;
    const char *src;
    size_t len;
};

static void *copy_part(void *arg) {
    struct copy_job *job = arg;
    memcpy(job->dst, job->src, job->len);
    return NULL;
}

/* GB/s of memory traffic (bytes read + bytes written) of the best of five
   1 GiB copies on `threads` threads. */
static double copy_bandwidth_here(int threads) {
    const size_t size = (size_t)1 << 30;
    char *src = malloc(size), *dst = malloc(size);
    if (!src || !dst) {
        free(src);
        free(dst);
        return 0;
    }
    memset(src, 1, size);
    memset(dst, 2, size);
    double best = 1e30;
    pthread_t tid[256];
    struct copy_job jobs[256];
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_seconds();
        size_t part = size / (size_t)threads;
        for (int i = 0; i < threads; i++) {
            jobs[i] = (struct copy_job){dst + part * i, src + part * i, part};
            pthread_create(&tid[i], NULL, copy_part, &jobs[i]);
        }
        for (int i = 0; i < threads; i++) pthread_join(tid[i], NULL);
        double t = now_seconds() - t0;
        if (t < best) best = t;
    }
    free(src);
    free(dst);
    return 2.0 * (double)size / best / 1e9;
}

/* The copy runs in a child process, so that its 2 GiB of buffers do not
   count in this process's peak RSS. */
static double copy_bandwidth(int threads) {
    int fds[2];
    if (pipe(fds) != 0) return copy_bandwidth_here(threads);
    pid_t child = fork();
    if (child == 0) {
        double gbps = copy_bandwidth_here(threads);
        ssize_t ignored = write(fds[1], &gbps, sizeof gbps);
        (void)ignored;
        _exit(0);
    }
    double gbps = 0;
    if (child < 0 || read(fds[0], &gbps, sizeof gbps) != (ssize_t)sizeof gbps) gbps = 0;
    close(fds[0]);
    close(fds[1]);
    if (child > 0) waitpid(child, NULL, 0);
    return gbps;
}

/* ---- small helpers ---- */

/* The integer after "key": in a flat JSON object, or -1. */
static long long json_int(const char *json, const char *key) {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char *at = strstr(json, pattern);
    return at ? strtoll(at + strlen(pattern), NULL, 10) : -1;
}

/* The number after "key": in a flat JSON object, or -1. */
static double json_double(const char *json, const char *key) {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char *at = strstr(json, pattern);
    return at ? strtod(at + strlen(pattern), NULL) : -1;
}

static void json_str(const char *json, const char *key, char *out, size_t cap) {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\":\"", key);
    const char *at = strstr(json, pattern);
    out[0] = '\0';
    if (!at) return;
    at += strlen(pattern);
    size_t n = 0;
    while (at[n] && at[n] != '"' && n + 1 < cap) { out[n] = at[n]; n++; }
    out[n] = '\0';
}

static uint64_t rng_state = 0x853c49e6748fea9bULL;
static m40_token random_token(int n_vocab) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (m40_token)((rng_state >> 33) % (uint64_t)n_vocab);
}

struct result {
    char test[48];
    int n_prompt, n_gen, batch, depth;
    double mean, stddev;  /* tokens/s */
    double roofline;      /* fraction, or < 0 when not a generation test */
};

static void stats(const double *v, int n, double *mean, double *sd) {
    double s = 0, q = 0;
    for (int i = 0; i < n; i++) s += v[i];
    *mean = s / n;
    for (int i = 0; i < n; i++) q += (v[i] - *mean) * (v[i] - *mean);
    *sd = n > 1 ? sqrt(q / (n - 1)) : 0;
}

/* ---- the tests ---- */

/* A test's sessions are filled to their depth once (the tokens before the
   test: llama-bench's --n-depth); each run takes them back to it (rewind_to),
   so that runs start from the same context without paying for it again. */
static m40_session *new_session(m40_model *model, int n_ctx, int n_batch) {
    m40_session_params sp = m40_session_default_params();
    sp.n_ctx = (uint32_t)n_ctx;
    if (n_batch > 0) sp.n_batch = (uint32_t)n_batch;
    m40_session *s = NULL;
    if (m40_session_new(model, &sp, &s) != M40_OK) die("session");
    return s;
}

static void decode_random(m40_session *s, int n_vocab, int n) {
    if (n <= 0) return;
    m40_token *tokens = malloc(sizeof(m40_token) * (size_t)n);
    for (int i = 0; i < n; i++) tokens[i] = random_token(n_vocab);
    if (m40_decode(s, tokens, (size_t)n) != M40_OK) die("decode");
    free(tokens);
}

static void truncate_to(m40_session *s, int n_keep) {
    if (m40_session_truncate(s, (uint32_t)n_keep) != M40_OK) die("truncate");
}

/* Brings a session back to n_keep tokens of context before a run, outside
   its timing. A hybrid model's recurrent states cannot run backwards: the
   first decode after a truncation takes in the kept tokens again
   (m40_session_truncate), which would land in the timed call. Truncating
   one token further and decoding a token in its place pays for that here;
   for other models it costs one token. */
static void rewind_to(m40_session *s, int n_vocab, int n_keep) {
    truncate_to(s, n_keep > 0 ? n_keep - 1 : 0);
    decode_random(s, n_vocab, n_keep > 0 ? 1 : 0);
}

/* tokens/s of an n_prompt-token prompt in one m40_decode, after `depth`
   tokens of context. */
static double run_pp(m40_session *s, int n_vocab, int depth, int n_prompt) {
    rewind_to(s, n_vocab, depth);
    m40_token *tokens = malloc(sizeof(m40_token) * (size_t)n_prompt);
    for (int i = 0; i < n_prompt; i++) tokens[i] = random_token(n_vocab);
    double t0 = now_seconds();
    if (m40_decode(s, tokens, (size_t)n_prompt) != M40_OK) die("decode");
    double t = now_seconds() - t0;
    free(tokens);
    return n_prompt / t;
}

/* B sessions, each holding `depth` + 1 tokens, stepped n_gen times one
   token each: m40_decode for one session, m40_decode_batch for several;
   with `sample`, m40_decode_batch_sample, each step's tokens those the last
   one sampled. Aggregate tokens/s. */
static double run_tg(m40_session **s, int batch, int n_vocab, int depth, int n_gen, int sample) {
    m40_token *tokens = malloc(sizeof(m40_token) * (size_t)batch);
    for (int b = 0; b < batch; b++) rewind_to(s[b], n_vocab, depth + 1);
    double t0 = now_seconds();
    for (int b = 0; b < batch; b++) tokens[b] = random_token(n_vocab);
    for (int i = 0; i < n_gen; i++) {
        m40_status st;
        if (sample) {
            st = m40_decode_batch_sample(s, tokens, (size_t)batch, NULL, tokens);
        } else {
            for (int b = 0; b < batch; b++) tokens[b] = random_token(n_vocab);
            st = batch == 1 ? m40_decode(s[0], tokens, 1) : m40_decode_batch(s, tokens, (size_t)batch);
        }
        if (st != M40_OK) die("decode");
    }
    double t = now_seconds() - t0;
    free(tokens);
    return (double)n_gen * batch / t;
}

/* Up to `cap` integers of at least `min` from a comma-separated list; the
   count, or -1 when the list is malformed. */
static int parse_list(const char *list, int *out, int cap, int min) {
    int n = 0;
    const char *at = list;
    for (;;) {
        char *end;
        long v = strtol(at, &end, 10);
        if (end == at || v < min || v > 1 << 24 || n == cap) return -1;
        out[n++] = (int)v;
        if (*end == '\0') return n;
        if (*end != ',') return -1;
        at = end + 1;
    }
}

/* Comma- or slash-separated shares (llama-bench's -ts): the count, or -1. */
static int parse_shares(const char *list, float *out, int cap) {
    int n = 0;
    const char *at = list;
    for (;;) {
        char *end;
        double v = strtod(at, &end);
        if (end == at || !(v >= 0) || n == cap) return -1;
        out[n++] = (float)v;
        if (*end == '\0') return n;
        if (*end != ',' && *end != '/') return -1;
        at = end + 1;
    }
}

static void usage(void) {
    fprintf(stderr,
            "usage: m40-bench -m MODEL [-d DEVICE[,DEVICE...] [--ts SHARES]] [-t THREADS] [-p 512]\n"
            "                 [-n 128] [-r 5] [-b 1,8,32] [--n-depth 0,2048] [-s] [--n-batch N] [--json]\n"
            "  -p N      prompt tokens for the pp test (0: skip)\n"
            "  --n-batch N  the pp test's prompt chunk, as a session's n_batch (default: the\n"
            "            whole prompt in one pass)\n"
            "  -n N      generated tokens for the tg tests (0: skip)\n"
            "  -r N      repetitions after one warm-up\n"
            "  -b LIST   sessions stepped together with m40_decode_batch, e.g. 1,8,32\n"
            "  --n-depth LIST  tokens of context before each test (llama-bench's -d), e.g. 0,2048\n"
            "  -s        tg steps also sample each session's next token (m40_decode_batch_sample)\n"
            "  -d D      -1: CPU, 0..: CUDA device (default: CUDA 0 if usable); a list splits the\n"
            "            layers over the devices in order, e.g. 0,1 or -1,0 (CPU first, GPU last)\n"
            "  --ts LIST  each listed device's share of the layers, e.g. 3,1 (default: from free memory)\n"
            "  -t N      CPU threads (default: one per core)\n");
    exit(2);
}

/* A row's name as llama-bench writes it: pp512, tg128, tg128@8 (8 sessions),
   +s when sampling, " @ d2048" after 2048 tokens of context. */
static void test_name(char *out, size_t cap, const char *kind, int n, int batch, int sample, int depth) {
    char depth_suffix[32] = "", batch_suffix[16] = "";
    if (depth > 0) snprintf(depth_suffix, sizeof depth_suffix, " @ d%d", depth);
    if (batch > 1) snprintf(batch_suffix, sizeof batch_suffix, "@%d", batch);
    snprintf(out, cap, "%s%d%s%s%s", kind, n, batch_suffix, sample ? "+s" : "", depth_suffix);
}

int main(int argc, char **argv) {
    const char *path = NULL;
    m40_model_params mp = m40_model_default_params();
    int n_prompt = 512, n_gen = 128, reps = 5, json = 0, n_batch = 0, sample = 0;
    int batches[16] = {1}, n_batches = 1, depths[16] = {0}, n_depths = 1;
    int devices[64], n_devices = 0, n_shares = 0;
    float shares[64];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--json") == 0) { json = 1; continue; }
        if (strcmp(a, "-s") == 0) { sample = 1; continue; }
        if (!v) usage();
        if (strcmp(a, "-m") == 0) path = v;
        else if (strcmp(a, "-d") == 0) {
            if ((n_devices = parse_list(v, devices, 64, -1)) < 0) usage();
            mp.device = devices[0];
        } else if (strcmp(a, "--ts") == 0) {
            if ((n_shares = parse_shares(v, shares, 64)) < 0) usage();
        }
        else if (strcmp(a, "-t") == 0) mp.n_threads = (uint32_t)atoi(v);
        else if (strcmp(a, "-p") == 0) n_prompt = atoi(v);
        else if (strcmp(a, "-n") == 0) n_gen = atoi(v);
        else if (strcmp(a, "-r") == 0) reps = atoi(v);
        else if (strcmp(a, "--n-batch") == 0) n_batch = atoi(v);
        else if (strcmp(a, "-b") == 0) {
            if ((n_batches = parse_list(v, batches, 16, 1)) < 0) usage();
        } else if (strcmp(a, "--n-depth") == 0) {
            if ((n_depths = parse_list(v, depths, 16, 0)) < 0) usage();
        } else usage();
        i++;
    }
    if (!path || reps < 1 || n_prompt < 0 || n_gen < 0 || n_batch < 0) usage();
    if (n_shares > 0 && n_shares != n_devices) usage();

    m40_model *model = NULL;
    if (n_devices > 1) {
        m40_device_share split[64];
        for (int i = 0; i < n_devices; i++) {
            split[i].device = devices[i];
            split[i].share = n_shares > 0 ? shares[i] : 0.0f;
        }
        if (m40_model_load_split(path, &mp, split, (size_t)n_devices, &model) != M40_OK) die("load");
    } else if (m40_model_load(path, &mp, &model) != M40_OK) {
        die("load");
    }
    size_t len = 0;
    m40_model_describe(model, NULL, 0, &len);
    char *desc = malloc(len + 1);
    if (m40_model_describe(model, desc, len + 1, NULL) != M40_OK) die("describe");
    int n_vocab = m40_model_n_vocab(model);
    long long file_size = json_int(desc, "file_size"), params = json_int(desc, "parameters");
    long long per_token = json_int(desc, "weight_bytes_per_token");
    long long threads = json_int(desc, "threads");
    char arch[64], name[128], backend[32], device[128];
    json_str(desc, "architecture", arch, sizeof arch);
    json_str(desc, "name", name, sizeof name);
    json_str(desc, "backend", backend, sizeof backend);
    json_str(desc, "device", device, sizeof device);
    double bandwidth = json_double(desc, "memory_bandwidth_gbps");
    const char *bandwidth_kind = "device copy, read+write";
    if (bandwidth <= 0) {
        bandwidth = copy_bandwidth(threads > 0 ? (int)threads : 1);
        bandwidth_kind = "CPU copy, read+write";
    }

    struct result results[16 * 17];
    int n_results = 0;
    double *samples = malloc(sizeof(double) * (size_t)reps);
    for (int d = 0; d < n_depths; d++) {
        int depth = depths[d];
        if (n_prompt > 0) {
            m40_session *s = new_session(model, depth + n_prompt, n_batch > 0 ? n_batch : n_prompt);
            decode_random(s, n_vocab, depth);
            run_pp(s, n_vocab, depth, n_prompt); /* warm-up */
            for (int r = 0; r < reps; r++) samples[r] = run_pp(s, n_vocab, depth, n_prompt);
            m40_free(s);
            struct result *res = &results[n_results++];
            test_name(res->test, sizeof res->test, "pp", n_prompt, 1, 0, depth);
            res->n_prompt = n_prompt, res->n_gen = 0, res->batch = 1, res->depth = depth, res->roofline = -1;
            stats(samples, reps, &res->mean, &res->stddev);
        }
        for (int b = 0; n_gen > 0 && b < n_batches; b++) {
            int batch = batches[b];
            m40_session **s = calloc((size_t)batch, sizeof *s);
            for (int k = 0; k < batch; k++) {
                s[k] = new_session(model, depth + n_gen + 1, n_batch);
                decode_random(s[k], n_vocab, depth + 1);
            }
            run_tg(s, batch, n_vocab, depth, n_gen < 16 ? n_gen : 16, sample); /* warm-up */
            for (int r = 0; r < reps; r++) samples[r] = run_tg(s, batch, n_vocab, depth, n_gen, sample);
            for (int k = 0; k < batch; k++) m40_free(s[k]);
            free(s);
            struct result *res = &results[n_results++];
            test_name(res->test, sizeof res->test, "tg", n_gen, batch, sample, depth);
            res->n_prompt = 0, res->n_gen = n_gen, res->batch = batch, res->depth = depth;
            stats(samples, reps, &res->mean, &res->stddev);
            double steps_per_s = res->mean / batch;
            res->roofline =
                per_token > 0 && bandwidth > 0 ? (double)per_token * steps_per_s / (bandwidth * 1e9) : -1;
        }
    }
    struct rusage usage_now;
    getrusage(RUSAGE_SELF, &usage_now);
    long long peak_rss = (long long)usage_now.ru_maxrss * 1024;
    /* On a GPU, the device memory the runs needed at most (weights, KV
       caches and scratch together), read after them: the figure that says
       whether a model and a context fit a card. */
    long long device_peak = -1, device_total = -1;
    for (size_t cap = len + 256;; cap *= 2) {
        char *after = malloc(cap);
        enum m40_status status = m40_model_describe(model, after, cap, NULL);
        if (status == M40_OK) {
            device_peak = json_int(after, "peak");
            device_total = json_int(after, "total");
        }
        free(after);
        if (status != M40_ERR_BUFFER_TOO_SMALL) break;
    }

    if (json) {
        printf("[\n");
        for (int i = 0; i < n_results; i++) {
            struct result *r = &results[i];
            char roof[32] = "null";
            if (r->roofline >= 0) snprintf(roof, sizeof roof, "%.4f", r->roofline);
            printf("  {\"model\": \"%s\", \"architecture\": \"%s\", \"size\": %lld, \"params\": %lld, "
                   "\"backend\": \"%s\", \"device\": \"%s\", \"threads\": %lld, \"test\": \"%s\", "
                   "\"n_prompt\": %d, \"n_gen\": %d, \"n_depth\": %d, \"batch\": %d, \"repetitions\": %d, "
                   "\"avg_ts\": %.3f, \"stddev_ts\": %.3f, \"weight_bytes_per_token\": %lld, "
                   "\"bandwidth_gbps\": %.2f, \"roofline\": %s, \"peak_rss_bytes\": %lld, "
                   "\"device_memory_peak_bytes\": %lld}%s\n",
                   name, arch, file_size, params, backend, device, threads, r->test, r->n_prompt, r->n_gen,
                   r->depth, r->batch, reps, r->mean, r->stddev, per_token, bandwidth, roof, peak_rss, device_peak,
                   i + 1 < n_results ? "," : "");
        }
        printf("]\n");
    } else {
        printf("device: %s; memory bandwidth (%s): %.1f GB/s; weights read per generated token: "
               "%.1f MiB; peak RSS: %.1f MiB\n",
               device, bandwidth_kind, bandwidth, per_token / 1048576.0, peak_rss / 1048576.0);
        if (device_peak >= 0)
            printf("device memory: peak %.1f MiB of %.1f MiB\n", device_peak / 1048576.0, device_total / 1048576.0);
        const char *split = n_devices > 1 ? strstr(desc, "\"devices\":[") : NULL;
        if (split) {
            /* The describe object's device list, as it is: one object per device. */
            int depth = 0;
            const char *end = split + strlen("\"devices\":");
            do {
                depth += (*end == '[') - (*end == ']');
                end++;
            } while (depth > 0 && *end);
            printf("split: %.*s\n", (int)(end - split), split);
        }
        printf("\n");
        printf("| model | size | params | backend | threads | test | t/s | roofline |\n");
        printf("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |\n");
        for (int i = 0; i < n_results; i++) {
            struct result *r = &results[i];
            char roof[32] = "";
            if (r->roofline >= 0) snprintf(roof, sizeof roof, "%.0f%%", 100 * r->roofline);
            printf("| %s | %.2f MiB | %.2f M | %s | %lld | %s | %.2f ± %.2f | %s |\n", name, file_size / 1048576.0,
                   params / 1e6, backend, threads, r->test, r->mean, r->stddev, roof);
        }
    }
    free(samples);
    free(desc);
    m40_free(model);
    return 0;
}
