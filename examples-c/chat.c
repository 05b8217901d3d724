/*
 * chat: an interactive conversation with a chat model, one user message per
 * line of standard input.
 *
 *   chat MODEL [-n N] [--temp T] [--seed S] [-t THREADS] [-c CTX] [--device D] [--system TEXT]
 *
 * Each line becomes a user turn; the reply streams to standard output and
 * ends with a newline. The conversation is formatted with the model's chat
 * template (m40_chat_apply_template: ChatML, Qwen3, Gemma, LLaMA 3, Mistral
 * and LLaMA 2 formats, named on standard error at start), and only the text
 * a turn adds to what the session already holds is decoded, so earlier
 * turns stay in the KV cache.
 * When the context is full the conversation starts over (standard error
 * says so). Standard error also gets, per turn, the tokens decoded anew and
 * the session's length.
 */
#define _POSIX_C_SOURCE 200809L
#include "m40llm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A growable byte string. */
struct text {
    char *data;
    size_t len, cap;
};

static void text_reserve(struct text *t, size_t cap) {
    if (cap <= t->cap) return;
    size_t grown_cap = t->cap ? t->cap : 256;
    while (grown_cap < cap) grown_cap *= 2;
    char *grown = realloc(t->data, grown_cap);
    if (!grown) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    t->data = grown, t->cap = grown_cap;
}

static void text_append(struct text *t, const char *s, size_t n) {
    text_reserve(t, t->len + n + 1);
    memcpy(t->data + t->len, s, n);
    t->len += n;
    t->data[t->len] = '\0';
}

static void text_set(struct text *t, const char *s, size_t n) {
    t->len = 0;
    text_append(t, s, n);
}

/* The conversation: roles and contents the messages point into. */
struct conversation {
    m40_chat_message *messages;
    char **owned;
    size_t n, cap;
};

static void conversation_add(struct conversation *c, const char *role, const char *content, size_t len) {
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 16;
        c->messages = realloc(c->messages, c->cap * sizeof *c->messages);
        c->owned = realloc(c->owned, c->cap * sizeof *c->owned);
        if (!c->messages || !c->owned) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
    }
    char *copy = malloc(len + 1);
    if (!copy) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    memcpy(copy, content, len);
    copy[len] = '\0';
    c->owned[c->n] = copy;
    c->messages[c->n++] = (m40_chat_message){role, copy};
}

/* Keeps the first `keep` messages. */
static void conversation_truncate(struct conversation *c, size_t keep) {
    while (c->n > keep) free(c->owned[--c->n]);
}

/* The conversation's prompt text, with the assistant's turn opened. */
static int format(const m40_model *model, const struct conversation *c, struct text *out) {
    size_t len = 0;
    /* A size query: the text needs at least its NUL, so this is always "too small". */
    if (m40_chat_apply_template(model, c->messages, c->n, true, NULL, 0, &len) != M40_ERR_BUFFER_TOO_SMALL)
        return 0;
    text_reserve(out, len + 1);
    if (m40_chat_apply_template(model, c->messages, c->n, true, out->data, out->cap, &len) != M40_OK) return 0;
    out->len = len;
    return 1;
}

/* The length of t without a trailing incomplete UTF-8 character (a reply
   cut off by the token limit mid-character), which a template would refuse. */
static size_t whole_utf8_length(const struct text *t) {
    size_t start = t->len, back = 0;
    while (start > 0 && back < 4 && ((unsigned char)t->data[start - 1] & 0xC0) == 0x80) start--, back++;
    if (start == 0) return t->len;
    unsigned char lead = (unsigned char)t->data[start - 1];
    size_t need = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    return back + 1 >= need ? t->len : start - 1;
}

static bool on_piece(void *user_data, const char *piece, size_t len, m40_token token) {
    (void)token;
    text_append(user_data, piece, len);
    fwrite(piece, 1, len, stdout);
    fflush(stdout);
    return true;
}

static void usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s MODEL [-n N] [--temp T] [--seed S] [-t THREADS] [-c CTX] [--device D] [--system TEXT]\n"
            "  -n N           most tokens per reply (default 256)\n"
            "  --temp T       sampling temperature, 0 for greedy (default 0.8)\n"
            "  --seed S       random seed (default 0)\n"
            "  -t THREADS     CPU threads (default: one per core)\n"
            "  -c CTX         context size in tokens (default: min(training context, 4096))\n"
            "  --device D     -1 for the CPU, 0.. for a CUDA device (default: CUDA 0 if usable)\n"
            "  --system TEXT  a system message opening the conversation\n"
            "Reads one user message per line from standard input.\n",
            argv0);
}

int main(int argc, char **argv) {
    if (argc < 2 || argv[1][0] == '-') {
        usage(argv[0]);
        return 2;
    }
    m40_model_params model_params = m40_model_default_params();
    m40_session_params session_params = m40_session_default_params();
    m40_sampler_params sampler = m40_sampler_default_params();
    unsigned max_reply = 256;
    const char *system = NULL;
    for (int i = 2; i < argc; i += 2) {
        const char *flag = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!value) {
            usage(argv[0]);
            return 2;
        }
        if (strcmp(flag, "--system") == 0) {
            system = value;
            continue;
        }
        double v = strtod(value, &end);
        if (end == value || *end != '\0') {
            fprintf(stderr, "%s: '%s' is not a number\n", flag, value);
            return 2;
        }
        if (strcmp(flag, "-n") == 0) max_reply = (unsigned)v;
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
    }

    m40_model *model = NULL;
    m40_session *session = NULL;
    if (m40_model_load(argv[1], &model_params, &model) != M40_OK ||
        m40_session_new(model, &session_params, &session) != M40_OK) {
        fprintf(stderr, "error: %s\n", m40_last_error());
        m40_free(model);
        return 1;
    }
    struct conversation chat = {0};
    if (system) conversation_add(&chat, "system", system, strlen(system));
    const size_t n_opening = chat.n;
    struct text prompt = {0}, held = {0}, reply = {0};
    /* A model without a usable chat template fails here, with the reason. */
    if (!format(model, &chat, &prompt)) {
        fprintf(stderr, "error: %s\n", m40_last_error());
        return 1;
    }
    size_t desc_len = 0;
    m40_model_describe(model, NULL, 0, &desc_len);
    char *desc = malloc(desc_len + 1);
    if (desc && m40_model_describe(model, desc, desc_len + 1, NULL) == M40_OK) {
        const char *at = strstr(desc, "\"chat_template\":\"");
        if (at) {
            at += strlen("\"chat_template\":\"");
            fprintf(stderr, "chat template: %.*s\n", (int)strcspn(at, "\""), at);
        }
    }
    free(desc);

    const int interactive = isatty(STDIN_FILENO);
    char *line = NULL;
    size_t line_cap = 0;
    int status = 0;
    for (;;) {
        if (interactive) fputs("> ", stdout), fflush(stdout);
        ssize_t n = getline(&line, &line_cap, stdin);
        if (n < 0) break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
        if (n == 0) continue;
        conversation_add(&chat, "user", line, (size_t)n);
        for (int attempt = 0;; attempt++) {
            if (!format(model, &chat, &prompt)) {
                fprintf(stderr, "error: %s\n", m40_last_error());
                status = 1;
                goto done;
            }
            /* Decode only what this turn adds to the text the session holds;
               a history the template rewrote (it trims replies, or drops
               their reasoning) starts over. */
            const char *added = prompt.data;
            if (held.len <= prompt.len && (held.len == 0 || memcmp(prompt.data, held.data, held.len) == 0)) {
                added += held.len;
            } else {
                m40_session_reset(session);
                held.len = 0;
            }
            uint32_t before = m40_session_n_past(session);
            text_set(&reply, "", 0);
            m40_status st = m40_generate(session, added, strlen(added), &sampler, max_reply, on_piece, &reply);
            if (st == M40_OK) {
                fprintf(stderr, "[turn: %u tokens kept, %u decoded]\n", before, m40_session_n_past(session) - before);
                text_set(&held, prompt.data, prompt.len);
                text_append(&held, reply.data, reply.len);
                break;
            }
            if (st != M40_ERR_CONTEXT_FULL || attempt > 0) {
                fprintf(stderr, "\nerror: %s\n", m40_last_error());
                status = 1;
                goto done;
            }
            /* Start over with the opening messages and this turn. */
            fprintf(stderr, "\n[context full: the conversation starts over]\n");
            conversation_truncate(&chat, n_opening);
            conversation_add(&chat, "user", line, (size_t)n);
            m40_session_reset(session);
            held.len = 0;
        }
        conversation_add(&chat, "assistant", reply.data, whole_utf8_length(&reply));
        putchar('\n');
        fflush(stdout);
    }
done:
    free(line);
    conversation_truncate(&chat, 0);
    free(chat.messages);
    free(chat.owned);
    free(prompt.data);
    free(held.data);
    free(reply.data);
    m40_free(session);
    m40_free(model);
    return status;
}
