// m40llm.hpp: a header-only C++17 wrapper of the libm40llm C API (m40llm.h).
//
//   m40::Model model("gemma-3-270m-q4_k_m.gguf");
//   m40::Session session(model);
//   std::string text = session.generate("The capital of France is", 32, m40::greedy());
//
// Handles are owned by RAII objects (Model, Session: movable, not copyable);
// every failing call throws m40::Error with the library's status and message.
// Text goes in as std::string_view and comes out as std::string. A session
// keeps its model alive (the library guarantees it), so the two may be
// destroyed in any order.
#pragma once

#include "m40llm.h"

#include <cstddef>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace m40 {

// A libm40llm call failed: the status and the library's message.
class Error : public std::runtime_error {
  public:
    Error(m40_status status, const std::string &message) : std::runtime_error(message), status_(status) {}
    m40_status status() const noexcept { return status_; }

  private:
    m40_status status_;
};

namespace detail {

inline void check(m40_status status) {
    if (status != M40_OK) throw Error(status, m40_last_error());
}

// The first call of a two-call query (capacity 0) reports the size needed.
inline void check_size_query(m40_status status) {
    if (status != M40_ERR_BUFFER_TOO_SMALL) check(status);
}

// The owner of one library handle (m40_model or m40_session).
template <class Handle> class Owned {
  public:
    Owned() noexcept = default;
    explicit Owned(Handle *handle) noexcept : handle_(handle) {}
    Owned(Owned &&other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    Owned &operator=(Owned &&other) noexcept {
        if (this != &other) {
            m40_free(handle_);
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
    }
    Owned(const Owned &) = delete;
    Owned &operator=(const Owned &) = delete;
    ~Owned() { m40_free(handle_); }
    Handle *get() const noexcept { return handle_; }

  private:
    Handle *handle_ = nullptr;
};

// Calls a "fill this buffer, tell me the length" function: once for
// the length, then into a string of that size (again if it grew).
template <class Fill> std::string sized_text(Fill fill) {
    std::size_t length = 0;
    check_size_query(fill(nullptr, 0, &length));
    std::string text;
    // A text can grow between the two calls (a CUDA model's description
    // holds live memory figures): ask again with the new size.
    for (;;) {
        text.assign(length, '\0');
        const m40_status status = fill(text.data(), text.size() + 1, &length);
        if (status != M40_ERR_BUFFER_TOO_SMALL) {
            check(status);
            break;
        }
    }
    text.resize(length);
    return text;
}

}  // namespace detail

// Sampling settings: the library's defaults, or greedy (temperature 0).
inline m40_sampler_params default_sampler() { return m40_sampler_default_params(); }
inline m40_sampler_params greedy() {
    m40_sampler_params params = m40_sampler_default_params();
    params.temperature = 0.0f;
    return params;
}

inline std::string version() { return m40_version(); }

class Model {
  public:
    explicit Model(const std::string &path, const m40_model_params &params = m40_model_default_params()) {
        m40_model *model = nullptr;
        detail::check(m40_model_load(path.c_str(), &params, &model));
        handle_ = detail::Owned<m40_model>(model);
    }

    // The model with its layers split over `devices`, in order (m40_model_load_split):
    // {{0, 1}, {1, 1}} halves them over two GPUs, {{-1, 3}, {0, 1}} keeps three quarters on the CPU.
    Model(const std::string &path, const std::vector<m40_device_share> &devices,
          const m40_model_params &params = m40_model_default_params()) {
        m40_model *model = nullptr;
        detail::check(m40_model_load_split(path.c_str(), &params, devices.data(), devices.size(), &model));
        handle_ = detail::Owned<m40_model>(model);
    }

    m40_model *get() const noexcept { return handle_.get(); }
    int32_t n_vocab() const { return m40_model_n_vocab(get()); }
    int32_t n_ctx_train() const { return m40_model_n_ctx_train(get()); }
    m40_token bos() const { return m40_token_bos(get()); }
    m40_token eos() const { return m40_token_eos(get()); }
    bool is_end_of_generation(m40_token token) const { return m40_token_is_eog(get(), token); }

    // The model's description as JSON (m40_model_describe).
    std::string describe() const {
        return detail::sized_text(
            [&](char *buf, std::size_t cap, std::size_t *len) { return m40_model_describe(get(), buf, cap, len); });
    }

    std::vector<m40_token> tokenize(std::string_view text, bool add_special = true,
                                    bool parse_special = true) const {
        std::size_t n = 0;
        detail::check_size_query(
            m40_tokenize(get(), text.data(), text.size(), add_special, parse_special, nullptr, 0, &n));
        std::vector<m40_token> tokens(n);
        if (n > 0)
            detail::check(
                m40_tokenize(get(), text.data(), text.size(), add_special, parse_special, tokens.data(), n, &n));
        tokens.resize(n);
        return tokens;
    }

    std::string token_to_piece(m40_token token) const {
        return detail::sized_text([&](char *buf, std::size_t cap, std::size_t *len) {
            return m40_token_to_piece(get(), token, buf, cap, len);
        });
    }

    std::string detokenize(const std::vector<m40_token> &tokens) const {
        return detail::sized_text([&](char *buf, std::size_t cap, std::size_t *len) {
            return m40_detokenize(get(), tokens.data(), tokens.size(), buf, cap, len);
        });
    }

    // A conversation: (role, content) pairs, roles "system", "user", "assistant"
    // ("developer" too where the format has it: gpt-oss, gemma4).
    using Messages = std::vector<std::pair<std::string, std::string>>;

    // The conversation's prompt text in the model's chat format
    // (m40_chat_apply_template); for messages that must not write the
    // format's markup, use chat_tokenize.
    std::string apply_chat_template(const Messages &messages, bool add_assistant = true) const {
        const std::vector<m40_chat_message> list = c_messages(messages);
        return detail::sized_text([&](char *buf, std::size_t cap, std::size_t *len) {
            return m40_chat_apply_template(get(), list.data(), list.size(), add_assistant, buf, cap, len);
        });
    }

    // The conversation's tokens, BOS included, special tokens parsed in the
    // format's markup only (m40_chat_tokenize).
    std::vector<m40_token> chat_tokenize(const Messages &messages, bool add_assistant = true) const {
        const std::vector<m40_chat_message> list = c_messages(messages);
        std::size_t n = 0;
        detail::check_size_query(
            m40_chat_tokenize(get(), list.data(), list.size(), add_assistant, nullptr, 0, &n));
        std::vector<m40_token> tokens(n);
        if (n > 0)
            detail::check(
                m40_chat_tokenize(get(), list.data(), list.size(), add_assistant, tokens.data(), n, &n));
        tokens.resize(n);
        return tokens;
    }

  private:
    // Views of the strings of `messages` (which must outlive the result).
    static std::vector<m40_chat_message> c_messages(const Messages &messages) {
        std::vector<m40_chat_message> list;
        list.reserve(messages.size());
        for (const auto &m : messages) list.push_back({m.first.c_str(), m.second.c_str()});
        return list;
    }

    detail::Owned<m40_model> handle_;
};

class Session {
  public:
    explicit Session(const Model &model, const m40_session_params &params = m40_session_default_params())
        : n_vocab_(model.n_vocab()) {
        m40_session *session = nullptr;
        detail::check(m40_session_new(model.get(), &params, &session));
        handle_ = detail::Owned<m40_session>(session);
    }

    m40_session *get() const noexcept { return handle_.get(); }
    uint32_t n_past() const { return m40_session_n_past(get()); }
    void reset() { detail::check(m40_session_reset(get())); }
    void truncate(uint32_t n_keep) { detail::check(m40_session_truncate(get(), n_keep)); }

    // Appends tokens to the session and runs the model over them.
    void decode(const std::vector<m40_token> &tokens) {
        detail::check(m40_decode(get(), tokens.data(), tokens.size()));
    }

    // The next-token logits after the last decode (n_vocab values).
    std::vector<float> logits() const {
        const float *values = m40_logits(get());
        if (values == nullptr) throw Error(M40_ERR_INVALID_ARGUMENT, "no logits: nothing decoded yet");
        return std::vector<float>(values, values + n_vocab_);
    }

    m40_token sample(const m40_sampler_params &params = default_sampler()) {
        m40_token token = 0;
        detail::check(m40_sample(get(), &params, &token));
        return token;
    }

    // Generates up to max_tokens after the prompt, calling on_piece(std::string_view)
    // with each piece of text as it comes; on_piece returns false to stop
    // (or void to never stop). An exception thrown by on_piece stops the
    // generation and is rethrown here.
    template <class OnPiece>
    void generate(std::string_view prompt, uint32_t max_tokens, const m40_sampler_params &params,
                  OnPiece &&on_piece) {
        struct Context {
            OnPiece &callback;
            std::exception_ptr error;
        } context{on_piece, nullptr};
        // Exceptions must not unwind through the library's frames: caught
        // here, rethrown once the library has returned.
        const m40_piece_fn trampoline = [](void *user_data, const char *piece, std::size_t len,
                                           m40_token) -> bool {
            auto *c = static_cast<Context *>(user_data);
            try {
                if constexpr (std::is_void_v<decltype(c->callback(std::string_view()))>) {
                    c->callback(std::string_view(piece, len));
                    return true;
                } else {
                    return static_cast<bool>(c->callback(std::string_view(piece, len)));
                }
            } catch (...) {
                c->error = std::current_exception();
                return false;
            }
        };
        const m40_status status =
            m40_generate(get(), prompt.data(), prompt.size(), &params, max_tokens, trampoline, &context);
        if (context.error) std::rethrow_exception(context.error);
        detail::check(status);
    }

    // The whole generated text.
    std::string generate(std::string_view prompt, uint32_t max_tokens,
                         const m40_sampler_params &params = default_sampler()) {
        std::string text;
        generate(prompt, max_tokens, params, [&](std::string_view piece) { text.append(piece); });
        return text;
    }

  private:
    detail::Owned<m40_session> handle_;
    int32_t n_vocab_;
};

// One decode step for several sessions of one model: tokens[i] goes to
// sessions[i] (m40_decode_batch).
inline void decode_batch(const std::vector<Session *> &sessions, const std::vector<m40_token> &tokens) {
    if (sessions.size() != tokens.size())
        throw Error(M40_ERR_INVALID_ARGUMENT, "decode_batch: one token per session");
    std::vector<m40_session *> handles;
    handles.reserve(sessions.size());
    for (Session *s : sessions) handles.push_back(s->get());
    detail::check(m40_decode_batch(handles.data(), tokens.data(), handles.size()));
}

// decode_batch, then each session's next token sampled with params[i] (empty:
// the defaults for every session) as Session::sample would pick it, the
// logits left on the device (m40_decode_batch_sample): the sessions hold no
// logits afterwards.
inline std::vector<m40_token> decode_batch_sample(const std::vector<Session *> &sessions,
                                                  const std::vector<m40_token> &tokens,
                                                  const std::vector<m40_sampler_params> &params = {}) {
    if (sessions.size() != tokens.size())
        throw Error(M40_ERR_INVALID_ARGUMENT, "decode_batch_sample: one token per session");
    if (!params.empty() && params.size() != sessions.size())
        throw Error(M40_ERR_INVALID_ARGUMENT, "decode_batch_sample: one sampler per session");
    std::vector<m40_session *> handles;
    handles.reserve(sessions.size());
    for (Session *s : sessions) handles.push_back(s->get());
    std::vector<m40_token> next(sessions.size());
    detail::check(m40_decode_batch_sample(handles.data(), tokens.data(), handles.size(),
                                          params.empty() ? nullptr : params.data(), next.data()));
    return next;
}

}  // namespace m40
