// llama.cpp as the oracle for tokenizer, chat-template and logits references (tests/data/README.md):
// this program calls llama.cpp's public API only (llama.h) and prints what it returns.
//
//   llamacpp_oracle tokenize VOCAB.gguf < TEXTS
//       TEXTS: UTF-8 texts, each followed by a NUL byte. Prints one line per text: the ids
//       of llama_tokenize(add_special = false, parse_special = false) on the vocab-only
//       model, separated by spaces.
//   llamacpp_oracle chat TEMPLATE_FILE ADD_ASS < MESSAGES
//       MESSAGES: role NUL content NUL, repeated. Prints the text of
//       llama_chat_apply_template(template, messages, ADD_ASS = 0 or 1), or a line
//       "unsupported" when it returns a negative number (a template it does not know).
//   llamacpp_oracle logits MODEL.gguf TOKENS
//       TOKENS: comma-separated ids, decoded in one llama_decode with the logits of every
//       position asked for, on a fresh context of 4096 positions and 2 threads, the other
//       context parameters llama.cpp's defaults (as the arch2-tiny references were made;
//       the batch made as large as the sequence).
//       Prints one line per position: its 8 largest logits as "id:logit" (ties to the
//       lower id, 5 decimals), separated by spaces.
//
// Build against libllama of the llama.cpp the references name (0c1e57098: the llama.cpp that
// PyPI's llama-cpp-python 0.3.36 sdist vendors, as tests/fetch-vocab.py fetches it):
//   cmake -S llama.cpp -B llama.cpp/build -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
//       -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF
//   cmake --build llama.cpp/build --target llama
//   g++ -O2 -std=c++17 tools/llamacpp_oracle.cpp -I llama.cpp/include -I llama.cpp/ggml/include \
//       -L llama.cpp/build/bin -lllama -lggml -lggml-base -Wl,-rpath,llama.cpp/build/bin -o llamacpp_oracle
#include "llama.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

static std::vector<std::string> read_nul_separated() {
    std::string data((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    std::vector<std::string> out;
    size_t start = 0;
    for (size_t i = 0; i < data.size(); ++i) {
        if (data[i] == '\0') {
            out.emplace_back(data, start, i - start);
            start = i + 1;
        }
    }
    return out;
}

static void quiet(ggml_log_level, const char *, void *) {}

static int tokenize(const char * path) {
    llama_model_params params = llama_model_default_params();
    params.vocab_only = true;
    llama_model * model = llama_model_load_from_file(path, params);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", path);
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    for (const std::string & text : read_nul_separated()) {
        std::vector<llama_token> ids(text.size() + 8);
        int n = llama_tokenize(vocab, text.data(), (int) text.size(), ids.data(), (int) ids.size(), false, false);
        if (n < 0) {
            ids.resize(-n);
            n = llama_tokenize(vocab, text.data(), (int) text.size(), ids.data(), (int) ids.size(), false, false);
        }
        for (int i = 0; i < n; ++i) {
            printf(i ? " %d" : "%d", ids[i]);
        }
        printf("\n");
    }
    llama_model_free(model);
    return 0;
}

static int chat(const char * template_path, bool add_ass) {
    FILE * f = fopen(template_path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", template_path);
        return 1;
    }
    std::string tmpl;
    char chunk[4096];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
        tmpl.append(chunk, got);
    }
    fclose(f);
    std::vector<std::string> fields = read_nul_separated();
    std::vector<llama_chat_message> messages;
    for (size_t i = 0; i + 1 < fields.size(); i += 2) {
        messages.push_back({fields[i].c_str(), fields[i + 1].c_str()});
    }
    std::vector<char> buf(1 << 16);
    int n = llama_chat_apply_template(tmpl.c_str(), messages.data(), messages.size(), add_ass, buf.data(), (int) buf.size());
    if (n < 0) {
        printf("unsupported\n");
        return 0;
    }
    fwrite(buf.data(), 1, n, stdout);
    return 0;
}

static int logits(const char * path, const char * tokens) {
    std::vector<llama_token> ids;
    for (const char * p = tokens; *p;) {
        char * end;
        const long id = strtol(p, &end, 10);
        // A digit first (strtol would skip spaces and take signs), a comma or the end after.
        if (!isdigit((unsigned char) *p) || id > INT32_MAX || (*end && *end != ',') || (*end == ',' && !end[1])) {
            fprintf(stderr, "bad token list at \"%s\"\n", p);
            return 1;
        }
        ids.push_back((llama_token) id);
        p = *end == ',' ? end + 1 : end;
    }
    llama_backend_init();
    llama_model * model = llama_model_load_from_file(path, llama_model_default_params());
    if (!model) {
        fprintf(stderr, "cannot load %s\n", path);
        return 1;
    }
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = 4096;
    cparams.n_batch = std::max<uint32_t>(cparams.n_batch, ids.size());
    cparams.n_threads = 2;
    cparams.n_threads_batch = 2;
    llama_context * ctx = llama_init_from_model(model, cparams);
    const int n = (int) ids.size();
    llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; ++i) {
        batch.token[i] = ids[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = true;
    }
    batch.n_tokens = n;
    if (!ctx || llama_decode(ctx, batch) != 0) {
        fprintf(stderr, "decode failed\n");
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    const int top = std::min(8, n_vocab);
    std::vector<int> order(n_vocab);
    for (int i = 0; i < n; ++i) {
        const float * row = llama_get_logits_ith(ctx, i);
        if (!row) {
            fprintf(stderr, "no logits at position %d\n", i);
            return 1;
        }
        for (int t = 0; t < n_vocab; ++t) {
            if (std::isnan(row[t])) {
                fprintf(stderr, "NaN logit at position %d\n", i);
                return 1;
            }
            order[t] = t;
        }
        std::partial_sort(order.begin(), order.begin() + top, order.end(),
                          [&](int a, int b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
        for (int k = 0; k < top; ++k) {
            printf(k ? " %d:%.5f" : "%d:%.5f", order[k], row[order[k]]);
        }
        printf("\n");
    }
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}

int main(int argc, char ** argv) {
    llama_log_set(quiet, nullptr);
    if (argc == 3 && !strcmp(argv[1], "tokenize")) {
        return tokenize(argv[2]);
    }
    if (argc == 4 && !strcmp(argv[1], "chat")) {
        return chat(argv[2], !strcmp(argv[3], "1"));
    }
    if (argc == 4 && !strcmp(argv[1], "logits")) {
        return logits(argv[2], argv[3]);
    }
    fprintf(stderr, "usage: llamacpp_oracle tokenize VOCAB.gguf < TEXTS | chat TEMPLATE_FILE 0|1 < MESSAGES"
                    " | logits MODEL.gguf TOKENS\n");
    return 2;
}
