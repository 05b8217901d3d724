package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	m40 "m40llm/bindings/go"
)

// request is the body of a completion or chat completion. Fields that
// change what OpenAI would generate and that the server cannot honour are
// refused (400) rather than ignored.
type request struct {
	Model               *string           `json:"model"`
	Prompt              json.RawMessage   `json:"prompt"`
	Messages            []json.RawMessage `json:"messages"`
	MaxTokens           *int              `json:"max_tokens"`
	MaxCompletionTokens *int              `json:"max_completion_tokens"`
	Temperature         *float32          `json:"temperature"`
	TopP                *float32          `json:"top_p"`
	TopK                *int              `json:"top_k"`
	MinP                *float32          `json:"min_p"`
	RepeatPenalty       *float32          `json:"repeat_penalty"`
	Seed                *int64            `json:"seed"`
	Stream              bool              `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Stop             json.RawMessage    `json:"stop"`
	N                *int               `json:"n"`
	Logprobs         json.RawMessage    `json:"logprobs"`
	TopLogprobs      *int               `json:"top_logprobs"`
	Echo             bool               `json:"echo"`
	Suffix           *string            `json:"suffix"`
	BestOf           *int               `json:"best_of"`
	PresencePenalty  *float32           `json:"presence_penalty"`
	FrequencyPenalty *float32           `json:"frequency_penalty"`
	LogitBias        map[string]float32 `json:"logit_bias"`
	Tools            json.RawMessage    `json:"tools"`
	Functions        json.RawMessage    `json:"functions"`
	ResponseFormat   *struct {
		Type string `json:"type"`
	} `json:"response_format"`
}

// params is a request checked and resolved against the server's limits.
type params struct {
	chat        bool
	prompt      []m40.Token
	promptText  string // the completion prompt (for text offsets)
	maxTokens   int
	n           int
	sampler     m40.SamplerParams
	stops       [][]byte
	topLogprobs int // -1: no log-probabilities
	stream      bool
	usageChunk  bool
}

type badRequest struct {
	status int
	kind   string
	msg    string
}

func (e *badRequest) Error() string { return e.msg }

func invalid(format string, args ...any) error {
	return &badRequest{http.StatusBadRequest, "invalid_request_error", fmt.Sprintf(format, args...)}
}

func httpError(w http.ResponseWriter, status int, kind, message string) {
	body := map[string]any{"message": message, "type": kind}
	if status == http.StatusNotFound {
		body["code"] = "model_not_found"
	}
	writeJSON(w, status, map[string]any{"error": body})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, err error) {
	var bad *badRequest
	if errors.As(err, &bad) {
		httpError(w, bad.status, bad.kind, bad.msg)
		return
	}
	httpError(w, http.StatusInternalServerError, "server_error", err.Error())
}

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		httpError(w, http.StatusMethodNotAllowed, "invalid_request_error", "GET only")
		return
	}
	model := map[string]any{"id": s.cfg.Name, "object": "model", "created": s.cfg.Created, "owned_by": "m40llm"}
	if id := strings.TrimPrefix(r.URL.Path, "/v1/models/"); id != r.URL.Path {
		if id != s.cfg.Name {
			httpError(w, http.StatusNotFound, "invalid_request_error", fmt.Sprintf("the model %q does not exist; this server has %q", id, s.cfg.Name))
			return
		}
		writeJSON(w, http.StatusOK, model)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{model}})
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	s.serve(w, r, false)
}

func (s *Server) chatCompletions(w http.ResponseWriter, r *http.Request) {
	s.serve(w, r, true)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request, chat bool) {
	if r.Method != http.MethodPost {
		httpError(w, http.StatusMethodNotAllowed, "invalid_request_error", "POST only")
		return
	}
	if s.stopping() {
		httpError(w, http.StatusServiceUnavailable, "server_error", stopping)
		return
	}
	var req request
	decoder := json.NewDecoder(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err := decoder.Decode(&req); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			httpError(w, http.StatusRequestEntityTooLarge, "invalid_request_error",
				fmt.Sprintf("the request body is over %d bytes", s.cfg.MaxBodyBytes))
			return
		}
		httpError(w, http.StatusBadRequest, "invalid_request_error", "invalid JSON: "+err.Error())
		return
	}
	p, err := s.resolve(&req, chat)
	if err != nil {
		fail(w, err)
		return
	}
	if u, ok := r.Context().Value(usageKey{}).(*usage); ok {
		u.prompt = len(p.prompt)
	}
	s.run(w, r, p)
}

// resolve checks a request and turns it into what the scheduler needs.
func (s *Server) resolve(req *request, chat bool) (*params, error) {
	p := &params{chat: chat, n: 1, topLogprobs: -1, stream: req.Stream}
	if req.Model != nil && *req.Model != s.cfg.Name {
		return nil, &badRequest{http.StatusNotFound, "invalid_request_error",
			fmt.Sprintf("the model %q does not exist; this server has %q", *req.Model, s.cfg.Name)}
	}
	switch {
	case req.Echo:
		return nil, invalid(`"echo" is not supported`)
	case req.Suffix != nil:
		return nil, invalid(`"suffix" is not supported`)
	case req.BestOf != nil && *req.BestOf != 1:
		return nil, invalid(`"best_of" other than 1 is not supported`)
	case req.PresencePenalty != nil && *req.PresencePenalty != 0,
		req.FrequencyPenalty != nil && *req.FrequencyPenalty != 0:
		return nil, invalid(`"presence_penalty" and "frequency_penalty" are not supported (use "repeat_penalty")`)
	case len(req.LogitBias) > 0:
		return nil, invalid(`"logit_bias" is not supported`)
	case isSet(req.Tools) || isSet(req.Functions):
		return nil, invalid(`tools and functions are not supported`)
	case req.ResponseFormat != nil && req.ResponseFormat.Type != "text":
		return nil, invalid(`"response_format" %q is not supported (only "text")`, req.ResponseFormat.Type)
	case req.StreamOptions != nil && !req.Stream:
		return nil, invalid(`"stream_options" needs "stream": true`)
	}

	// Sampling.
	p.sampler = m40.DefaultSampler()
	if t := req.Temperature; t != nil {
		if *t < 0 || *t > 2 {
			return nil, invalid(`"temperature" must be between 0 and 2`)
		}
		p.sampler.Temperature = *t
	}
	if v := req.TopP; v != nil {
		if *v <= 0 || *v > 1 {
			return nil, invalid(`"top_p" must be above 0 and at most 1`)
		}
		p.sampler.TopP = *v
	}
	if v := req.TopK; v != nil {
		if *v < 0 {
			return nil, invalid(`"top_k" must be at least 0`)
		}
		p.sampler.TopK = *v
	}
	if v := req.MinP; v != nil {
		if *v < 0 || *v > 1 {
			return nil, invalid(`"min_p" must be between 0 and 1`)
		}
		p.sampler.MinP = *v
	}
	if v := req.RepeatPenalty; v != nil {
		if *v <= 0 {
			return nil, invalid(`"repeat_penalty" must be above 0`)
		}
		p.sampler.RepeatPenalty = *v
	}
	if req.Seed != nil {
		p.sampler.Seed = uint64(*req.Seed)
	} else {
		p.sampler.Seed = uint64(time.Now().UnixNano())
	}
	if req.N != nil {
		if *req.N < 1 || *req.N > s.cfg.MaxChoices {
			return nil, invalid(`"n" must be between 1 and %d`, s.cfg.MaxChoices)
		}
		p.n = *req.N
	}
	if stops, err := parseStop(req.Stop); err != nil {
		return nil, err
	} else {
		p.stops = stops
	}
	if err := p.parseLogprobs(req, chat); err != nil {
		return nil, err
	}
	if req.StreamOptions != nil {
		p.usageChunk = req.StreamOptions.IncludeUsage
	}

	// The prompt: refused by its size before it is tokenized when it
	// cannot fit, then by its tokens.
	limit := s.cfg.NCtx * s.maxTokenBytes
	var err error
	if chat {
		p.prompt, err = s.chatPrompt(req.Messages, limit)
	} else {
		p.promptText, err = promptText(req.Prompt)
		if err == nil && len(p.promptText) > limit {
			err = s.tooLong(fmt.Sprintf("%d bytes", len(p.promptText)))
		}
		if err == nil {
			p.prompt, err = s.model.Tokenize(p.promptText, true)
		}
	}
	if err != nil {
		var bad *badRequest
		if errors.As(err, &bad) {
			return nil, err
		}
		return nil, invalid("%v", err)
	}
	if len(p.prompt) == 0 {
		return nil, invalid("the prompt is empty (and this model adds no BOS token)")
	}
	if len(p.prompt) >= s.cfg.NCtx {
		return nil, s.tooLong(fmt.Sprintf("%d tokens", len(p.prompt)))
	}

	// The token budget: given (at least 1), or the default; never past the
	// context.
	p.maxTokens = s.cfg.DefaultMaxTokens
	if !chat && p.maxTokens > 16 {
		p.maxTokens = 16 // OpenAI's default for a completion
	}
	for _, v := range []*int{req.MaxTokens, req.MaxCompletionTokens} {
		if v != nil {
			if *v < 1 {
				return nil, invalid(`"max_tokens" and "max_completion_tokens" must be at least 1`)
			}
			p.maxTokens = *v
		}
	}
	if room := s.cfg.NCtx - len(p.prompt); p.maxTokens > room {
		p.maxTokens = room
	}
	return p, nil
}

func (s *Server) tooLong(size string) error {
	return &badRequest{http.StatusBadRequest, "invalid_request_error",
		fmt.Sprintf("the prompt (%s) does not fit the context of %d tokens", size, s.cfg.NCtx)}
}

func isSet(raw json.RawMessage) bool {
	return len(raw) > 0 && !bytes.Equal(raw, []byte("null"))
}

// promptText is a completion's prompt: a string or a list of one string.
func promptText(raw json.RawMessage) (string, error) {
	var text string
	if err := json.Unmarshal(raw, &text); err == nil && isSet(raw) {
		return text, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err == nil && len(list) == 1 {
		return list[0], nil
	}
	return "", invalid(`"prompt" must be a string (or a list of one string)`)
}

// parseStop reads "stop": a string or up to four strings.
func parseStop(raw json.RawMessage) ([][]byte, error) {
	if !isSet(raw) {
		return nil, nil
	}
	var list []string
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		list = []string{one}
	} else if err := json.Unmarshal(raw, &list); err != nil {
		return nil, invalid(`"stop" must be a string or a list of strings`)
	}
	if len(list) > 4 {
		return nil, invalid(`"stop" may hold at most 4 strings`)
	}
	var stops [][]byte
	for _, s := range list {
		if s == "" || len(s) > 256 {
			return nil, invalid(`each "stop" string must have 1 to 256 bytes`)
		}
		stops = append(stops, []byte(s))
	}
	return stops, nil
}

// parseLogprobs reads a completion's "logprobs" (0 to 5 alternatives) or a
// chat's "logprobs" (true or false) and "top_logprobs" (0 to 20).
func (p *params) parseLogprobs(req *request, chat bool) error {
	if !chat {
		if req.TopLogprobs != nil {
			return invalid(`"top_logprobs" is for chat completions; a completion's "logprobs" gives the count`)
		}
		if !isSet(req.Logprobs) {
			return nil
		}
		var n int
		if err := json.Unmarshal(req.Logprobs, &n); err != nil || n < 0 || n > 5 {
			return invalid(`a completion's "logprobs" must be an integer from 0 to 5`)
		}
		p.topLogprobs = n
		return nil
	}
	on := false
	if isSet(req.Logprobs) {
		if err := json.Unmarshal(req.Logprobs, &on); err != nil {
			return invalid(`a chat completion's "logprobs" must be true or false`)
		}
	}
	if req.TopLogprobs != nil {
		if !on {
			return invalid(`"top_logprobs" needs "logprobs": true`)
		}
		if *req.TopLogprobs < 0 || *req.TopLogprobs > 20 {
			return invalid(`"top_logprobs" must be from 0 to 20`)
		}
	}
	if on {
		p.topLogprobs = 0
		if req.TopLogprobs != nil {
			p.topLogprobs = *req.TopLogprobs
		}
	}
	return nil
}

// chatPrompt is the tokens of a chat's messages. Their text is never parsed
// for special tokens (m40_chat_tokenize): a message cannot close its turn.
func (s *Server) chatPrompt(raw []json.RawMessage, limit int) ([]m40.Token, error) {
	if len(raw) == 0 {
		return nil, invalid(`"messages" (a non-empty list) is required`)
	}
	messages := make([]m40.ChatMessage, 0, len(raw))
	size := 0
	for i, r := range raw {
		var m struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(r, &m); err != nil {
			return nil, invalid("messages[%d]: %v", i, err)
		}
		switch m.Role {
		case "developer":
			m.Role = "system"
		case "system", "user", "assistant":
		default:
			return nil, invalid(`messages[%d].role is %q; roles are "system", "developer", "user" and "assistant"`, i, m.Role)
		}
		content, err := messageText(m.Content)
		if err != nil {
			return nil, invalid("messages[%d].content: %v", i, err)
		}
		if strings.IndexByte(content, 0) >= 0 {
			return nil, invalid("messages[%d].content holds a NUL character", i)
		}
		size += len(content)
		messages = append(messages, m40.ChatMessage{Role: m.Role, Content: content})
	}
	if size > limit {
		return nil, s.tooLong(fmt.Sprintf("%d bytes of messages", size))
	}
	return s.model.ChatTokenize(messages, true)
}

// messageText is a message's content: a string, or a list of text parts.
func messageText(raw json.RawMessage) (string, error) {
	var text string
	if err := json.Unmarshal(raw, &text); err == nil {
		return text, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("a string or a list of text parts")
	}
	var b strings.Builder
	for _, part := range parts {
		if part.Type != "text" {
			return "", fmt.Errorf("parts of type %q are not supported (only text)", part.Type)
		}
		b.WriteString(part.Text)
	}
	return b.String(), nil
}

// choice is one choice's result as it builds up.
type choice struct {
	text     strings.Builder
	logprobs []tokenLogprob
	finish   string
	tokens   int
}

// run queues the request's choices and writes the reply, whole or as
// events.
func (s *Server) run(w http.ResponseWriter, r *http.Request, p *params) {
	if s.inFlight.Add(int64(p.n)) > int64(s.cfg.Sessions+s.cfg.QueueLimit) {
		s.inFlight.Add(-int64(p.n))
		w.Header().Set("Retry-After", "1")
		httpError(w, http.StatusTooManyRequests, "rate_limit_error",
			fmt.Sprintf("the server is busy (%d sessions, %d requests may wait): try again shortly", s.cfg.Sessions, s.cfg.QueueLimit))
		return
	}
	defer s.inFlight.Add(-int64(p.n))
	s.metrics.promptTokens.Add(int64(len(p.prompt)))

	arrived := time.Now()
	// Ended when the reply is: choices still running after another failed
	// stop at their next step.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	events := make(chan event, p.n*(p.maxTokens+2))
	var firstOnce bool
	for i := 0; i < p.n; i++ {
		sampler := p.sampler
		sampler.Seed += uint64(i)
		j := &job{
			ctx: ctx, choice: i, prompt: p.prompt, maxTokens: p.maxTokens, sampler: sampler,
			topLogprobs: p.topLogprobs, stop: stopper{stops: p.stops}, events: events,
		}
		select {
		case s.jobs <- j:
		case <-s.stop:
			if i == 0 {
				httpError(w, http.StatusServiceUnavailable, "server_error", stopping)
				return
			}
			events <- event{choice: i, err: stopping, done: true}
		}
	}
	noteFirst := func() {
		if !firstOnce {
			firstOnce = true
			s.metrics.firstToken(time.Since(arrived))
		}
	}

	id := fmt.Sprintf("m40-%d", time.Now().UnixNano())
	created := time.Now().Unix()
	choices := make([]choice, p.n)
	if !p.stream {
		for remaining := p.n; remaining > 0; {
			ev := <-events
			noteFirst()
			if ev.err != "" {
				cancel()
				s.drain(events, remaining-1)
				s.setWriteDeadline(r)
				fail(w, errors.New(ev.err))
				return
			}
			c := &choices[ev.choice]
			c.text.WriteString(ev.text)
			c.logprobs = append(c.logprobs, ev.logprobs...)
			if ev.done {
				c.finish, c.tokens = ev.finish, ev.generated
				remaining--
			}
		}
		s.writeWhole(w, r, p, id, created, choices)
		return
	}
	s.stream(w, r, p, id, created, events, noteFirst, cancel)
}

// drain waits for the choices still running to end (their events are
// dropped), so that none outlives its request.
func (s *Server) drain(events <-chan event, remaining int) {
	for remaining > 0 {
		if (<-events).done {
			remaining--
		}
	}
}

// usageJSON is a reply's "usage", its completion tokens also noted for the
// request's log line.
func usageJSON(r *http.Request, p *params, generated int) map[string]any {
	if u, ok := r.Context().Value(usageKey{}).(*usage); ok {
		u.completion = generated
	}
	return map[string]any{"prompt_tokens": len(p.prompt), "completion_tokens": generated,
		"total_tokens": len(p.prompt) + generated}
}

func (s *Server) writeWhole(w http.ResponseWriter, r *http.Request, p *params, id string, created int64, choices []choice) {
	generated := 0
	list := make([]any, len(choices))
	for i := range choices {
		c := &choices[i]
		generated += c.tokens
		out := map[string]any{"index": i, "finish_reason": c.finish, "logprobs": nil}
		if p.topLogprobs >= 0 {
			out["logprobs"] = s.logprobsJSON(p, c.logprobs)
		}
		if p.chat {
			out["message"] = map[string]any{"role": "assistant", "content": c.text.String()}
		} else {
			out["text"] = c.text.String()
		}
		list[i] = out
	}
	object := "text_completion"
	if p.chat {
		object = "chat.completion"
	}
	s.setWriteDeadline(r)
	writeJSON(w, http.StatusOK, map[string]any{
		"id": id, "object": object, "created": created, "model": s.cfg.Name,
		"choices": list, "usage": usageJSON(r, p, generated),
	})
}

// logprobsJSON is a choice's log-probabilities in the endpoint's format.
func (s *Server) logprobsJSON(p *params, lps []tokenLogprob) any {
	if p.chat {
		content := make([]any, len(lps))
		for i, lp := range lps {
			top := make([]any, len(lp.top))
			for k, alt := range lp.top {
				top[k] = map[string]any{"token": string(alt.token), "logprob": alt.logprob, "bytes": byteList(alt.token)}
			}
			content[i] = map[string]any{"token": string(lp.token), "logprob": lp.logprob,
				"bytes": byteList(lp.token), "top_logprobs": top}
		}
		return map[string]any{"content": content}
	}
	tokens := make([]string, len(lps))
	values := make([]float32, len(lps))
	offsets := make([]int, len(lps))
	top := make([]map[string]float32, len(lps))
	for i, lp := range lps {
		tokens[i], values[i], offsets[i] = string(lp.token), lp.logprob, len(p.promptText)+lp.offset
		top[i] = map[string]float32{}
		for _, alt := range lp.top {
			top[i][string(alt.token)] = alt.logprob
		}
	}
	return map[string]any{"tokens": tokens, "token_logprobs": values, "top_logprobs": top, "text_offset": offsets}
}

func byteList(b []byte) []int {
	out := make([]int, len(b))
	for i, c := range b {
		out[i] = int(c)
	}
	return out
}

// stream writes the choices' events as server-sent events, then the usage
// (when asked for) and [DONE]. Once the client is gone, the scheduler sees
// the request's context end and drops its jobs; their last events are
// drained.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, p *params, id string, created int64,
	events <-chan event, noteFirst func(), cancel func()) {
	object := "text_completion"
	if p.chat {
		object = "chat.completion.chunk"
	}
	flusher, _ := w.(http.Flusher)
	started, ok := false, true
	write := func(payload []byte) {
		if !ok {
			return
		}
		s.setWriteDeadline(r)
		if _, err := fmt.Fprintf(w, "data: %s\n\n", payload); err != nil {
			ok = false
			return
		}
		if flusher != nil {
			flusher.Flush()
		}
	}
	chunk := func(c map[string]any) {
		body := map[string]any{"id": id, "object": object, "created": created, "model": s.cfg.Name,
			"choices": []any{c}}
		if p.usageChunk {
			body["usage"] = nil
		}
		data, _ := json.Marshal(body)
		write(data)
	}
	start := func() {
		if started {
			return
		}
		started = true
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		if p.chat {
			for i := 0; i < p.n; i++ {
				chunk(map[string]any{"index": i, "delta": map[string]any{"role": "assistant", "content": ""},
					"finish_reason": nil, "logprobs": nil})
			}
		}
	}
	generated := 0
	failure := ""
	for remaining := p.n; remaining > 0; {
		ev := <-events
		if ev.done {
			remaining--
			generated += ev.generated
		}
		if ev.err != "" {
			cancel() // the other choices stop at their next step
			if !started {
				// Nothing is out yet: the failure gets an error status.
				s.drain(events, remaining)
				s.setWriteDeadline(r)
				fail(w, errors.New(ev.err))
				return
			}
			if failure == "" {
				failure = ev.err
			}
			continue
		}
		noteFirst()
		start()
		if ev.text == "" && len(ev.logprobs) == 0 && !ev.done {
			continue
		}
		out := map[string]any{"index": ev.choice, "finish_reason": nil, "logprobs": nil}
		if ev.done {
			out["finish_reason"] = ev.finish
		}
		if p.topLogprobs >= 0 && len(ev.logprobs) > 0 {
			out["logprobs"] = s.logprobsJSON(p, ev.logprobs)
		}
		if p.chat {
			delta := map[string]any{}
			if ev.text != "" {
				delta["content"] = ev.text
			}
			out["delta"] = delta
		} else {
			out["text"] = ev.text
		}
		chunk(out)
	}
	totals := usageJSON(r, p, generated)
	if failure != "" {
		data, _ := json.Marshal(map[string]any{"error": map[string]any{"message": failure, "type": "server_error"}})
		write(data)
	} else if p.usageChunk {
		data, _ := json.Marshal(map[string]any{"id": id, "object": object, "created": created,
			"model": s.cfg.Name, "choices": []any{}, "usage": totals})
		write(data)
	}
	write([]byte("[DONE]"))
}
