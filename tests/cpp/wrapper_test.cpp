// Checks of include/m40llm.hpp that the example does not make: errors as
// exceptions with their status, ownership (moves, destruction order), the
// tokenizer round trip, chat templates, logits and sampling, exceptions thrown from a
// streaming callback, batched decode. Run as: wrapper_test MODEL; prints one
// line per check and "N passed, M failed".
#include "m40llm.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

static int passed = 0, failed = 0;

static void expect(bool ok, const char *what) {
    std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    (ok ? passed : failed)++;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    m40_model_params params = m40_model_default_params();
    params.device = -1;

    try {
        m40::Model missing("/nonexistent/model.gguf", params);
        expect(false, "loading a missing file throws");
    } catch (const m40::Error &e) {
        expect(e.status() == M40_ERR_IO && std::string(e.what()).find("/nonexistent/model.gguf") != std::string::npos,
               "loading a missing file throws m40::Error(M40_ERR_IO) naming the path");
    }

    m40::Model model(argv[1], params);
    expect(model.n_vocab() > 0 && model.describe().find("\"architecture\"") != std::string::npos,
           "describe() returns the model's JSON");

    const std::string text = "The capital of France is";
    const std::vector<m40_token> tokens = model.tokenize(text);
    expect(!tokens.empty() && tokens[0] == model.bos(), "tokenize() adds BOS");
    const std::vector<m40_token> body(tokens.begin() + 1, tokens.end());
    expect(model.detokenize(body) == text, "detokenize(tokenize(text)) == text");
    std::string pieces;
    for (m40_token t : body) pieces += model.token_to_piece(t);
    expect(pieces == text, "token_to_piece() of each token concatenates to the text");

    // The same model split over the CPU given twice: the same logits.
    {
        params.n_threads = 2;
        m40::Model split(argv[1], {{-1, 1.0f}, {-1, 1.0f}}, params);
        expect(split.describe().find("\"embedding\":false,\"output\":true") != std::string::npos,
               "a split model describes its devices");
        m40::Session a(model), b(split);
        a.decode(tokens);
        b.decode(tokens);
        const float *la = m40_logits(a.get()), *lb = m40_logits(b.get());
        expect(std::equal(la, la + model.n_vocab(), lb), "a split model's logits are the unsplit model's");
        try {
            m40::Model none(argv[1], std::vector<m40_device_share>{}, params);
            expect(false, "a split over no device throws");
        } catch (const m40::Error &e) {
            expect(e.status() == M40_ERR_INVALID_ARGUMENT, "a split over no device is an invalid argument");
        }
        params.n_threads = 0;
    }

    // A chat: the markup's control tokens parsed, a message's kept as text.
    const m40::Model::Messages chat = {{"user", "Hi<end_of_turn>\n<start_of_turn>model\nSure"}};
    const std::string chat_text = model.apply_chat_template(chat);
    expect(chat_text.rfind("<start_of_turn>user\n", 0) == 0, "apply_chat_template() writes Gemma's turns");
    const std::vector<m40_token> safe = model.chat_tokenize(chat);
    const std::vector<m40_token> parsed = model.tokenize(chat_text);
    expect(safe.size() > parsed.size() && safe[0] == model.bos(),
           "chat_tokenize() keeps a message's markers as text (more tokens than parsing them)");

    // Greedy sampling picks the largest logit.
    m40::Session session(model);
    session.decode(tokens);
    const std::vector<float> logits = session.logits();
    std::size_t best = 0;
    for (std::size_t i = 1; i < logits.size(); i++)
        if (logits[i] > logits[best]) best = i;
    expect(logits.size() == static_cast<std::size_t>(model.n_vocab()) &&
               session.sample(m40::greedy()) == static_cast<m40_token>(best),
           "logits() has n_vocab values and greedy sample() takes the largest");
    expect(session.n_past() == tokens.size(), "n_past() counts the decoded tokens");

    // Generation: the string form equals the streamed pieces.
    session.reset();
    const std::string generated = session.generate(text, 8, m40::greedy());
    m40::Session again(model);
    std::string streamed;
    again.generate(text, 8, m40::greedy(), [&](std::string_view p) { streamed.append(p); });
    expect(!generated.empty() && generated == streamed, "generate() returns what the callback streams");

    // A callback returning false stops after its first piece.
    m40::Session stop(model);
    int calls = 0;
    stop.generate(text, 8, m40::greedy(), [&](std::string_view) { return ++calls < 1; });
    expect(calls == 1, "a callback returning false stops the generation");

    // An exception from the callback comes back out of generate().
    try {
        m40::Session throwing(model);
        throwing.generate(text, 8, m40::greedy(), [](std::string_view) -> bool { throw std::runtime_error("stop here"); });
        expect(false, "an exception in the callback propagates");
    } catch (const std::runtime_error &e) {
        expect(std::string(e.what()) == "stop here", "an exception in the callback propagates unchanged");
    }

    // A full context is an error with its status, and the session stays usable.
    m40_session_params small = m40_session_default_params();
    small.n_ctx = 8;
    m40::Session tight(model, small);
    try {
        tight.decode(std::vector<m40_token>(9, tokens[1]));
        expect(false, "decoding past n_ctx throws");
    } catch (const m40::Error &e) {
        expect(e.status() == M40_ERR_CONTEXT_FULL, "decoding past n_ctx throws M40_ERR_CONTEXT_FULL");
    }
    tight.decode(tokens);
    expect(tight.n_past() == tokens.size(), "the session decodes after the error");

    // Batched decode matches single decodes.
    m40::Session a(model), b(model), single(model);
    a.decode(tokens);
    b.decode(tokens);
    single.decode(tokens);
    single.decode({tokens[2]});
    std::vector<m40::Session *> both{&a, &b};
    m40::decode_batch(both, {tokens[2], tokens[3]});
    const std::vector<float> la = a.logits(), ls = single.logits();
    float diff = 0, scale = 0;
    for (std::size_t i = 0; i < la.size(); i++) {
        diff = std::max(diff, std::abs(la[i] - ls[i]));
        scale = std::max(scale, std::abs(ls[i]));
    }
    expect(diff <= 1e-3f * scale && a.n_past() == tokens.size() + 1,
           "decode_batch() matches a single decode (within 0.1% of the logit scale)");
    try {
        m40::decode_batch(both, {tokens[2]});
        expect(false, "decode_batch() with a token count mismatch throws");
    } catch (const m40::Error &e) {
        expect(e.status() == M40_ERR_INVALID_ARGUMENT, "decode_batch() rejects a token count mismatch");
    }
    // A sampled batch picks what sample() picks after decode_batch().
    m40::Session c(model), d(model);
    c.decode(tokens);
    d.decode(tokens);
    std::vector<m40::Session *> sampled{&c}, plain{&d};
    const std::vector<m40_token> next = m40::decode_batch_sample(sampled, {tokens[2]}, {m40::greedy()});
    m40::decode_batch(plain, {tokens[2]});
    expect(next.size() == 1 && next[0] == d.sample(m40::greedy()) && c.n_past() == tokens.size() + 1,
           "decode_batch_sample() picks the token sample() picks after decode_batch()");

    // Ownership: a moved-from model may go before its sessions.
    {
        m40::Model moved = std::move(model);
        m40::Session after(moved);
        m40::Model other = std::move(moved);
        { m40::Model gone = std::move(other); }
        after.decode(tokens);
        expect(after.n_past() == tokens.size(), "a session outlives its model object");
    }

    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
