/*
 * A C host of libm40llm, written against include/m40llm.h the way customers
 * use it: error statuses and messages, NULL arguments, the describe buffer
 * protocol, handle lifetimes and free order, threads sharing one model.
 *
 * usage: abi_host VALID_TINY_LLAMA MALFORMED_FILE N_VOCAB [GEMMA_GGUF]
 * Prints one line per check; exits 1 if any check failed.
 */
#include "m40llm.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond, ...)                                              \
    do {                                                              \
        if (cond) {                                                   \
            printf("ok    ");                                         \
        } else {                                                      \
            printf("FAIL  ");                                         \
            failures++;                                               \
        }                                                             \
        printf(__VA_ARGS__);                                          \
        printf("  [last error: %s]\n", m40_last_error());             \
    } while (0)

static int contains(const char *haystack, const char *needle) {
    return haystack && strstr(haystack, needle) != NULL;
}

struct thread_job {
    m40_model *model;
    int ok;
};

/* Each thread describes the shared model and makes its own error: the
   last-error message must stay per thread. */
static void *describe_in_thread(void *arg) {
    struct thread_job *job = arg;
    job->ok = 1;
    for (int i = 0; i < 50; i++) {
        char buf[4096];
        size_t len = 0;
        if (m40_model_describe(job->model, buf, sizeof buf, &len) != M40_OK || strlen(buf) != len)
            job->ok = 0;
        if (m40_model_n_vocab(NULL) != -1 || !contains(m40_last_error(), "NULL"))
            job->ok = 0;
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s VALID MALFORMED N_VOCAB [GEMMA]\n", argv[0]);
        return 2;
    }
    const char *valid = argv[1], *malformed = argv[2];
    int n_vocab = atoi(argv[3]);
    const char *gemma = argc > 4 ? argv[4] : NULL;

    /* Library identity and status names. */
    CHECK(m40_abi_version() == M40_ABI_VERSION, "abi version %u", m40_abi_version());
    CHECK(m40_version() && strlen(m40_version()) > 0, "version \"%s\"", m40_version());
    CHECK(strcmp(m40_last_error(), "") == 0, "no error before any call");
    CHECK(strcmp(m40_status_str(M40_OK), "ok") == 0, "status_str(M40_OK)");
    CHECK(contains(m40_status_str(M40_ERR_FORMAT), "GGUF"), "status_str(M40_ERR_FORMAT) = %s",
          m40_status_str(M40_ERR_FORMAT));
    CHECK(strlen(m40_status_str(M40_ERR_INTERNAL)) > 0, "status_str(M40_ERR_INTERNAL)");
    /* C lets an enum hold any int: every value gets a string. */
    CHECK(strcmp(m40_status_str((m40_status)-1), "unknown status") == 0 &&
              strcmp(m40_status_str((m40_status)1000), "unknown status") == 0 &&
              strcmp(m40_status_str((m40_status)INT32_MIN), "unknown status") == 0 &&
              strcmp(m40_status_str((m40_status)(M40_ERR_INTERNAL + 1)), "unknown status") == 0,
          "status_str of values outside the enum is \"unknown status\"");

    m40_model_params params = m40_model_default_params();
    CHECK(params.use_mmap && !params.vocab_only && params.device >= -1 && params.n_threads == 0,
          "default params: device %d, threads %u, mmap %d, vocab_only %d", params.device, params.n_threads,
          params.use_mmap, params.vocab_only);

    /* Argument errors. */
    m40_model *model = (m40_model *)0x1; /* must stay untouched on failure */
    CHECK(m40_model_load(NULL, NULL, &model) == M40_ERR_INVALID_ARGUMENT && contains(m40_last_error(), "path"),
          "load(NULL path) is an argument error");
    CHECK(model == (m40_model *)0x1, "out_model untouched on failure");
    CHECK(m40_model_load(valid, NULL, NULL) == M40_ERR_INVALID_ARGUMENT && contains(m40_last_error(), "out_model"),
          "load(NULL out_model) is an argument error");
    CHECK(m40_model_load("/nonexistent/dir/model.gguf", NULL, &model) == M40_ERR_IO &&
              contains(m40_last_error(), "/nonexistent/dir/model.gguf"),
          "missing file is M40_ERR_IO naming the path");
    CHECK(m40_model_load(malformed, NULL, &model) == M40_ERR_FORMAT && strlen(m40_last_error()) > 0,
          "malformed file is M40_ERR_FORMAT");
    m40_model_params bad_device = m40_model_default_params();
    bad_device.device = -7;
    CHECK(m40_model_load(valid, &bad_device, &model) == M40_ERR_INVALID_ARGUMENT &&
              contains(m40_last_error(), "device"),
          "device -7 is an argument error");

    m40_model_params many_threads = m40_model_default_params();
    many_threads.device = -1;
    many_threads.n_threads = UINT32_MAX;
    CHECK(m40_model_load(valid, &many_threads, &model) == M40_ERR_INVALID_ARGUMENT &&
              contains(m40_last_error(), "n_threads 4294967295"),
          "n_threads UINT32_MAX is an argument error, not an abort");
    CHECK(model == (m40_model *)0x1, "out_model untouched on failure");

    /* A valid model. */
    m40_status st = m40_model_load(valid, NULL, &model);
    CHECK(st == M40_OK && model != NULL && model != (m40_model *)0x1, "load(valid) = %s", m40_status_str(st));
    if (st != M40_OK)
        return 1;
    CHECK(m40_model_n_vocab(model) == n_vocab, "n_vocab %d", m40_model_n_vocab(model));
    CHECK(m40_model_n_ctx_train(model) == 256, "n_ctx_train %d", m40_model_n_ctx_train(model));

    /* The describe buffer protocol: size query, too small, exact. */
    size_t len = 0;
    CHECK(m40_model_describe(model, NULL, 0, &len) == M40_ERR_BUFFER_TOO_SMALL && len > 0,
          "describe size query says %zu bytes", len);
    char small[8];
    memset(small, 'x', sizeof small);
    size_t len2 = 0;
    CHECK(m40_model_describe(model, small, sizeof small, &len2) == M40_ERR_BUFFER_TOO_SMALL && len2 == len &&
              small[0] == 'x' && small[7] == 'x',
          "describe into 8 bytes: too small, buffer untouched");
    char *json = malloc(len + 1);
    CHECK(m40_model_describe(model, json, len + 1, &len2) == M40_OK && strlen(json) == len,
          "describe: %s", json);
    CHECK(contains(json, "\"architecture\":\"llama\"") && contains(json, "\"layers\":2") &&
              contains(json, "\"tensor_types\":{\"F32\":21}") && contains(json, "\"backend\":\"cpu\""),
          "describe names the architecture, layers, tensor types and backend");
    CHECK(m40_model_describe(model, json, len, &len2) == M40_ERR_BUFFER_TOO_SMALL,
          "describe needs room for the NUL");
    CHECK(m40_model_describe(model, NULL, 16, &len2) == M40_ERR_INVALID_ARGUMENT, "describe(NULL buf, cap 16)");
    free(json);

    /* Other load modes. */
    m40_model_params read_in = m40_model_default_params();
    read_in.use_mmap = false;
    read_in.n_threads = 2;
    m40_model *copy = NULL;
    CHECK(m40_model_load(valid, &read_in, &copy) == M40_OK && m40_model_n_vocab(copy) == n_vocab,
          "load with use_mmap=false");
    m40_model_params vocab = m40_model_default_params();
    vocab.vocab_only = true;
    m40_model *vocab_model = NULL;
    CHECK(m40_model_load(valid, &vocab, &vocab_model) == M40_OK && m40_model_n_vocab(vocab_model) == n_vocab,
          "load with vocab_only=true");

    /* Threads share one model; errors stay per thread. */
    pthread_t threads[4];
    struct thread_job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i].model = model;
        pthread_create(&threads[i], NULL, describe_in_thread, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(threads[i], NULL);
        CHECK(jobs[i].ok, "thread %d described the shared model", i);
    }

    /* Handles that are not handles. */
    CHECK(m40_model_n_vocab(NULL) == -1 && contains(m40_last_error(), "NULL"), "n_vocab(NULL) is -1");
    int not_a_model = 0;
    CHECK(m40_model_n_vocab((const m40_model *)&not_a_model) == -1 && contains(m40_last_error(), "not a live"),
          "n_vocab(garbage pointer) is -1");
    CHECK(m40_free(NULL) == M40_OK, "free(NULL) is a no-op");
    CHECK(m40_free(&not_a_model) == M40_ERR_INVALID_ARGUMENT, "free(garbage pointer) is reported");

    /* Sessions. */
    m40_session *session = NULL;
    CHECK(m40_session_new(NULL, NULL, &session) == M40_ERR_INVALID_ARGUMENT, "session_new(NULL model)");
    CHECK(m40_session_new(vocab_model, NULL, &session) == M40_ERR_INVALID_ARGUMENT,
          "a vocab-only model runs no session");
    CHECK(m40_session_new(model, NULL, &session) == M40_OK && session != NULL, "session_new");
    CHECK(m40_session_n_past(session) == 0 && m40_logits(session) == NULL, "a new session is empty");
    CHECK(m40_session_memory_bytes(session) > 0, "a session reports the memory its cache holds");
    CHECK(m40_session_memory_bytes(NULL) == 0 && m40_last_error()[0] != '\0', "memory_bytes(NULL) is 0");
    CHECK(m40_model_n_vocab((const m40_model *)session) == -1 && contains(m40_last_error(), "session handle"),
          "a session handle is not a model");
    const m40_token prompt[3] = {1, 5, 9};
    CHECK(m40_decode(session, prompt, 3) == M40_OK && m40_session_n_past(session) == 3, "decode a prompt");
    const float *logits = m40_logits(session);
    int best = 0;
    for (int i = 1; logits && i < n_vocab; i++)
        if (logits[i] > logits[best])
            best = i;

    /* The same model split over the CPU given twice: the same logits. */
    const m40_device_share cpu_twice[2] = {{-1, 1.0f}, {-1, 1.0f}};
    m40_model *split = (m40_model *)0x1;
    CHECK(m40_model_load_split(valid, NULL, cpu_twice, 0, &split) == M40_ERR_INVALID_ARGUMENT &&
              split == (m40_model *)0x1 && contains(m40_last_error(), "n_devices"),
          "a split of 0 devices is refused");
    CHECK(m40_model_load_split(valid, NULL, NULL, 2, &split) == M40_ERR_INVALID_ARGUMENT, "a NULL device list");
    const m40_device_share negative_share[2] = {{-1, 1.0f}, {-1, -2.0f}};
    CHECK(m40_model_load_split(valid, NULL, negative_share, 2, &split) == M40_ERR_INVALID_ARGUMENT &&
              contains(m40_last_error(), "share"),
          "a negative share is refused");
    m40_model_params two_threads = m40_model_default_params();
    two_threads.n_threads = 2;
    CHECK(m40_model_load_split(valid, &two_threads, cpu_twice, 2, &split) == M40_OK, "load split: %s",
          m40_last_error());
    len = 0;
    m40_model_describe(split, NULL, 0, &len);
    char *split_json = malloc(len + 1);
    CHECK(m40_model_describe(split, split_json, len + 1, NULL) == M40_OK &&
              contains(split_json, "\"layers\":[0,1],\"embedding\":true,\"output\":false") &&
              contains(split_json, "\"layers\":[1,2],\"embedding\":false,\"output\":true"),
          "describe lists the split: %s", split_json);
    free(split_json);
    m40_session *split_session = NULL;
    CHECK(m40_session_new(split, NULL, &split_session) == M40_OK &&
              m40_decode(split_session, prompt, 3) == M40_OK && logits &&
              memcmp(m40_logits(split_session), logits, sizeof(float) * (size_t)n_vocab) == 0,
          "a split model's logits are the unsplit model's");
    m40_free(split_session);
    m40_free(split);

    m40_sampler_params greedy = m40_sampler_default_params();
    CHECK(greedy.temperature > 0.79f && greedy.top_k == 40 && greedy.repeat_last_n == 64, "sampler defaults");
    greedy.temperature = 0.0f;
    m40_token next = -1;
    CHECK(m40_sample(session, &greedy, &next) == M40_OK && next == best, "greedy sample is the argmax (%d)", next);
    const m40_token bad[1] = {1000000};
    CHECK(m40_decode(session, bad, 1) == M40_ERR_INVALID_ARGUMENT && m40_session_n_past(session) == 3,
          "an out-of-vocabulary token is rejected and changes nothing");
    const m40_token negative[1] = {-3};
    CHECK(m40_decode(session, negative, 1) == M40_ERR_INVALID_ARGUMENT, "a negative token is rejected");
    CHECK(m40_decode(session, NULL, 2) == M40_ERR_INVALID_ARGUMENT, "decode(NULL tokens, 2)");

    m40_session_params huge_ctx = m40_session_default_params();
    huge_ctx.n_ctx = UINT32_MAX;
    m40_session *huge_session = NULL;
    CHECK(m40_session_new(model, &huge_ctx, &huge_session) == M40_ERR_OUT_OF_MEMORY && huge_session == NULL &&
              contains(m40_last_error(), "available"),
          "a KV cache larger than memory is M40_ERR_OUT_OF_MEMORY, not a killed process");

    m40_session_params tiny_ctx = m40_session_default_params();
    tiny_ctx.n_ctx = 4;
    m40_session *small_session = NULL;
    CHECK(m40_session_new(model, &tiny_ctx, &small_session) == M40_OK, "session with n_ctx 4");
    const m40_token five[5] = {1, 2, 3, 4, 5};
    CHECK(m40_decode(small_session, five, 5) == M40_ERR_CONTEXT_FULL && m40_session_n_past(small_session) == 0,
          "five tokens into four places: context full, nothing changed");
    CHECK(m40_decode(small_session, five, 4) == M40_OK, "four tokens fit");

    m40_session *pair[2] = {session, small_session};
    const m40_token pair_tokens[2] = {7, 8};
    CHECK(m40_decode_batch(pair, pair_tokens, 2) == M40_ERR_CONTEXT_FULL, "batched decode with a full session fails");
    CHECK(m40_session_n_past(session) == 3, "and changes no session");
    CHECK(m40_session_truncate(small_session, 2) == M40_OK && m40_session_n_past(small_session) == 2,
          "truncate to 2");
    CHECK(m40_session_truncate(small_session, 3) == M40_ERR_INVALID_ARGUMENT, "truncate past n_past");
    CHECK(m40_decode_batch(pair, pair_tokens, 2) == M40_OK && m40_session_n_past(session) == 4 &&
              m40_session_n_past(small_session) == 3,
          "batched decode of two sessions");
    m40_session *twice[2] = {session, session};
    CHECK(m40_decode_batch(twice, pair_tokens, 2) == M40_ERR_INVALID_ARGUMENT, "a session twice in one batch");
    m40_token sampled[2] = {-1, -1};
    CHECK(m40_decode_batch_sample(pair, pair_tokens, 2, NULL, NULL) == M40_ERR_INVALID_ARGUMENT &&
              m40_session_n_past(session) == 4,
          "a sampled batch without out_tokens fails and changes nothing");
    m40_sampler_params samplers[2] = {m40_sampler_default_params(), m40_sampler_default_params()};
    samplers[0].temperature = 0.0f;
    samplers[1].repeat_penalty = 0.0f;
    CHECK(m40_decode_batch_sample(pair, pair_tokens, 2, samplers, sampled) == M40_ERR_INVALID_ARGUMENT &&
              sampled[0] == -1 && contains(m40_last_error(), "session 1"),
          "a sampled batch with a bad sampler names its session and writes no token");
    samplers[1] = samplers[0];
    CHECK(m40_decode_batch_sample(pair, pair_tokens, 2, samplers, sampled) == M40_OK && sampled[0] >= 0 &&
              sampled[0] < m40_model_n_vocab(model) && sampled[1] >= 0 && m40_session_n_past(session) == 5 &&
              m40_logits(session) == NULL,
          "a sampled batch decodes, writes each session's token, and keeps no logits");
    CHECK(m40_decode_batch_sample(pair, sampled, 1, NULL, sampled) == M40_OK && m40_session_n_past(session) == 6,
          "a sampled batch with the default samplers, fed its own token");
    CHECK(m40_session_truncate(session, 4) == M40_OK, "truncate back to 4");
    CHECK(m40_session_reset(small_session) == M40_OK && m40_session_n_past(small_session) == 0, "reset");
    CHECK(m40_free(small_session) == M40_OK, "free a session");

    /* Free order and double free: the session keeps its model alive. */
    CHECK(m40_free(model) == M40_OK, "free(model) while a session uses it");
    CHECK(m40_free(model) == M40_ERR_INVALID_ARGUMENT && contains(m40_last_error(), "already freed"),
          "second free(model) is reported, not a crash");
    CHECK(m40_model_n_vocab(model) == -1, "a freed model handle is no longer usable");
    CHECK(m40_decode(session, prompt, 1) == M40_OK && m40_session_n_past(session) == 5,
          "its session still decodes");
    CHECK(m40_free(session) == M40_OK, "free the session (and with it the model)");
    CHECK(m40_free(session) == M40_ERR_INVALID_ARGUMENT, "second free(session) is reported");
    CHECK(m40_session_n_past(session) == 0 && contains(m40_last_error(), "not a live session"),
          "a freed session is no longer usable");
    CHECK(m40_free(vocab_model) == M40_OK && m40_free(copy) == M40_OK, "free the other models");

    if (gemma) {
        m40_model *g = NULL;
        st = m40_model_load(gemma, NULL, &g);
        CHECK(st == M40_OK, "load Gemma 3 270M");
        if (st == M40_OK) {
            char buf[2048];
            CHECK(m40_model_describe(g, buf, sizeof buf, NULL) == M40_OK, "describe Gemma: %s", buf);
            CHECK(contains(buf, "\"architecture\":\"gemma3\"") && contains(buf, "\"layers\":18") &&
                      contains(buf, "\"embedding_size\":640") && contains(buf, "\"Q4_K\":27"),
                  "Gemma describes as gemma3, 18 layers, 640 wide, 27 Q4_K tensors");
            CHECK(m40_model_n_vocab(g) == 262144, "Gemma vocabulary %d", m40_model_n_vocab(g));
            CHECK(m40_model_n_ctx_train(g) == 32768, "Gemma training context %d", m40_model_n_ctx_train(g));
            CHECK(m40_free(g) == M40_OK, "free Gemma");
        }
    }

    printf("%d failed\n", failures);
    return failures == 0 ? 0 : 1;
}
