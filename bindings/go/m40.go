// Package m40 runs GGUF language models with libm40llm (CPU, or CUDA GPUs
// from the Tesla M40 up) through its C API.
//
// Models and sessions are closed explicitly with Close; a finalizer closes
// what a program forgets. Failures are *Error values carrying the library's
// status and message. The package finds the library with pkg-config
// (`make install` in the repository installs m40llm.pc).
package m40

/*
#cgo pkg-config: m40llm
#include <stdlib.h>
#include "m40llm.h"

bool m40go_on_piece(void *user_data, const char *piece, size_t len, m40_token token);
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/cgo"
	"sort"
	"sync"
	"unicode/utf8"
	"unsafe"
)

// Status is a libm40llm status code (m40_status).
type Status int

// The statuses of m40llm.h.
const (
	OK              Status = C.M40_OK
	InvalidArgument Status = C.M40_ERR_INVALID_ARGUMENT
	IO              Status = C.M40_ERR_IO
	Format          Status = C.M40_ERR_FORMAT
	Unsupported     Status = C.M40_ERR_UNSUPPORTED
	OutOfMemory     Status = C.M40_ERR_OUT_OF_MEMORY
	ContextFull     Status = C.M40_ERR_CONTEXT_FULL
	Backend         Status = C.M40_ERR_BACKEND
	BufferTooSmall  Status = C.M40_ERR_BUFFER_TOO_SMALL
	Internal        Status = C.M40_ERR_INTERNAL
)

const errClosed = "use of a closed handle"

func (s Status) String() string {
	if s < OK || s > Internal {
		return fmt.Sprintf("status %d", int(s))
	}
	return C.GoString(C.m40_status_str(C.enum_m40_status(s)))
}

// Error is a failed library call: its status and the library's message.
type Error struct {
	Status  Status
	Message string
}

func (e *Error) Error() string { return e.Message }

// check turns a status into an error with the calling thread's message. The
// goroutine must not have moved threads since the call: callers lock it.
func check(status C.enum_m40_status) error {
	if Status(status) == OK {
		return nil
	}
	return &Error{Status: Status(status), Message: C.GoString(C.m40_last_error())}
}

// call runs a C call on one OS thread, so that m40_last_error (thread-local)
// describes it.
func call(f func() C.enum_m40_status) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(f())
}

// Token is a vocabulary id.
type Token = int32

// ModelParams choose where a model runs.
type ModelParams struct {
	// Device: -1 for the CPU, 0.. for a CUDA device.
	Device int
	// Threads for the CPU backend; 0: one per core.
	Threads int
	// Split, when not empty, divides the model's layers over these devices
	// in order, and Device is not used (m40_model_load_split): GPU + CPU
	// is partial offload, several GPUs a layer split.
	Split []DeviceShare
}

// DeviceShare is one device of a split model: -1 for the CPU or a CUDA
// device index, and its share of the layers relative to the others' (0 on
// every entry: chosen from each device's free memory).
type DeviceShare struct {
	Device int
	Share  float32
}

// DefaultModelParams are the library's defaults (the first CUDA device when
// one is usable, else the CPU).
func DefaultModelParams() ModelParams {
	p := C.m40_model_default_params()
	return ModelParams{Device: int(p.device), Threads: int(p.n_threads)}
}

// Model is a loaded GGUF model; any number of goroutines may use it.
type Model struct {
	mu  sync.RWMutex
	ptr *C.struct_m40_model
}

// Load loads a GGUF model.
func Load(path string, params ModelParams) (*Model, error) {
	p := C.m40_model_default_params()
	p.device = C.int32_t(params.Device)
	p.n_threads = C.uint32_t(params.Threads)
	split := make([]C.struct_m40_device_share, len(params.Split))
	for i, d := range params.Split {
		split[i].device = C.int32_t(d.Device)
		split[i].share = C.float(d.Share)
	}
	return load(path, p, split)
}

// LoadVocab loads only a model's vocabulary and metadata: tokenizing, chat
// templates and Describe work; sessions do not.
func LoadVocab(path string) (*Model, error) {
	p := C.m40_model_default_params()
	p.vocab_only = true
	return load(path, p, nil)
}

// load loads the model at path on p's device, or split over the devices
// of split when there are any.
func load(path string, p C.struct_m40_model_params, split []C.struct_m40_device_share) (*Model, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var ptr *C.struct_m40_model
	err := call(func() C.enum_m40_status {
		if len(split) > 0 {
			return C.m40_model_load_split(cpath, &p, &split[0], C.size_t(len(split)), &ptr)
		}
		return C.m40_model_load(cpath, &p, &ptr)
	})
	if err != nil {
		return nil, err
	}
	m := &Model{ptr: ptr}
	runtime.SetFinalizer(m, (*Model).Close)
	return m, nil
}

// Close releases the model (its sessions keep it alive until they close).
// Closing twice is a no-op.
func (m *Model) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ptr == nil {
		return nil
	}
	err := call(func() C.enum_m40_status { return C.m40_free(unsafe.Pointer(m.ptr)) })
	m.ptr = nil
	runtime.SetFinalizer(m, nil)
	return err
}

// use runs f with the live handle, or fails when the model is closed.
func (m *Model) use(f func(*C.struct_m40_model) error) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.ptr == nil {
		return &Error{Status: InvalidArgument, Message: "model: " + errClosed}
	}
	return f(m.ptr)
}

// NVocab is the vocabulary size.
func (m *Model) NVocab() int {
	n := 0
	_ = m.use(func(p *C.struct_m40_model) error { n = int(C.m40_model_n_vocab(p)); return nil })
	return n
}

// IsEndOfGeneration reports whether a token ends generation (EOS, end of turn).
func (m *Model) IsEndOfGeneration(t Token) bool {
	eog := false
	_ = m.use(func(p *C.struct_m40_model) error { eog = bool(C.m40_token_is_eog(p, C.m40_token(t))); return nil })
	return eog
}

// sizedText runs a "fill this buffer" call twice: for the size, then the text.
func sizedText(fill func(buf *C.char, capacity C.size_t, n *C.size_t) C.enum_m40_status) (string, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var n C.size_t
	if st := fill(nil, 0, &n); Status(st) != BufferTooSmall {
		return "", check(st)
	}
	buf := C.malloc(n + 1)
	defer C.free(buf)
	if err := check(fill((*C.char)(buf), n+1, &n)); err != nil {
		return "", err
	}
	return C.GoStringN((*C.char)(buf), C.int(n)), nil
}

// Describe is the model's description as JSON (m40_model_describe).
func (m *Model) Describe() (string, error) {
	var text string
	err := m.use(func(p *C.struct_m40_model) (err error) {
		text, err = sizedText(func(buf *C.char, capacity C.size_t, n *C.size_t) C.enum_m40_status {
			return C.m40_model_describe(p, buf, capacity, n)
		})
		return
	})
	return text, err
}

// Tokenize splits text into tokens (with BOS when addSpecial; special-token
// text such as <start_of_turn> becomes its token).
func (m *Model) Tokenize(text string, addSpecial bool) ([]Token, error) {
	var tokens []Token
	err := m.use(func(p *C.struct_m40_model) (err error) {
		ctext := C.CString(text)
		defer C.free(unsafe.Pointer(ctext))
		tokens, err = sizedTokens(func(out *C.m40_token, capacity C.size_t, n *C.size_t) C.enum_m40_status {
			return C.m40_tokenize(p, ctext, C.size_t(len(text)), C.bool(addSpecial), true, out, capacity, n)
		})
		return
	})
	return tokens, err
}

// sizedTokens runs a "fill this token buffer" call twice: for the count,
// then the tokens.
func sizedTokens(fill func(out *C.m40_token, capacity C.size_t, n *C.size_t) C.enum_m40_status) ([]Token, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var n C.size_t
	if st := fill(nil, 0, &n); Status(st) != BufferTooSmall && Status(st) != OK {
		return nil, check(st)
	}
	tokens := make([]Token, int(n))
	if n == 0 {
		return tokens, nil
	}
	return tokens, check(fill((*C.m40_token)(unsafe.Pointer(&tokens[0])), n, &n))
}

// CompleteUTF8 is the length of text without a trailing incomplete UTF-8
// character (at most three bytes go): what of a run of token pieces can be
// shown now.
func CompleteUTF8(text []byte) int {
	for back := 1; back <= 3 && back <= len(text); back++ {
		b := text[len(text)-back]
		if b < 0x80 {
			return len(text) // ASCII: complete
		}
		if b >= 0xC0 { // a lead byte: complete only if its sequence is
			if utf8.FullRune(text[len(text)-back:]) {
				return len(text)
			}
			return len(text) - back
		}
	}
	return len(text)
}

// Detokenize is the text of tokens (m40_detokenize).
func (m *Model) Detokenize(tokens []Token) (string, error) {
	var text string
	err := m.use(func(p *C.struct_m40_model) (err error) {
		var first *C.m40_token
		if len(tokens) > 0 {
			first = (*C.m40_token)(unsafe.Pointer(&tokens[0]))
		}
		text, err = sizedText(func(buf *C.char, capacity C.size_t, n *C.size_t) C.enum_m40_status {
			return C.m40_detokenize(p, first, C.size_t(len(tokens)), buf, capacity, n)
		})
		return
	})
	return text, err
}

// TokenPiece is a token's text (control tokens as their text); pieces of a
// multi-byte character may be partial UTF-8.
func (m *Model) TokenPiece(t Token) (string, error) {
	var text string
	err := m.use(func(p *C.struct_m40_model) (err error) {
		text, err = sizedText(func(buf *C.char, capacity C.size_t, n *C.size_t) C.enum_m40_status {
			return C.m40_token_to_piece(p, C.m40_token(t), buf, capacity, n)
		})
		return
	})
	return text, err
}

// ChatMessage is one turn of a conversation: Role is "system", "user" or "assistant"
// ("developer" too where the model's chat format has it: gpt-oss, gemma4).
type ChatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// cMessages copies messages into C memory (one spare entry, so that the list
// is never empty); free releases it.
func cMessages(messages []ChatMessage) (list *C.m40_chat_message, free func()) {
	raw := C.malloc(C.size_t(len(messages)+1) * C.size_t(unsafe.Sizeof(C.m40_chat_message{})))
	entries := unsafe.Slice((*C.m40_chat_message)(raw), len(messages)+1)
	for i, msg := range messages {
		entries[i].role = C.CString(msg.Role)
		entries[i].content = C.CString(msg.Content)
	}
	return &entries[0], func() {
		for _, e := range entries[:len(messages)] {
			C.free(unsafe.Pointer(e.role))
			C.free(unsafe.Pointer(e.content))
		}
		C.free(raw)
	}
}

// ApplyChatTemplate formats a conversation with the model's chat template,
// opening the assistant's turn when addAssistant (m40_chat_apply_template).
func (m *Model) ApplyChatTemplate(messages []ChatMessage, addAssistant bool) (string, error) {
	var text string
	err := m.use(func(p *C.struct_m40_model) (err error) {
		list, free := cMessages(messages)
		defer free()
		text, err = sizedText(func(buf *C.char, capacity C.size_t, n *C.size_t) C.enum_m40_status {
			return C.m40_chat_apply_template(p, list, C.size_t(len(messages)), C.bool(addAssistant), buf, capacity, n)
		})
		return
	})
	return text, err
}

// ChatTokenize is the tokens of a conversation formatted with the model's
// chat template, BOS included (m40_chat_tokenize): special tokens are parsed
// in the template's markup only, so a message that holds "<end_of_turn>" or
// "<|im_end|>" cannot close its turn and forge another.
func (m *Model) ChatTokenize(messages []ChatMessage, addAssistant bool) ([]Token, error) {
	var tokens []Token
	err := m.use(func(p *C.struct_m40_model) (err error) {
		list, free := cMessages(messages)
		defer free()
		tokens, err = sizedTokens(func(out *C.m40_token, capacity C.size_t, n *C.size_t) C.enum_m40_status {
			return C.m40_chat_tokenize(p, list, C.size_t(len(messages)), C.bool(addAssistant), out, capacity, n)
		})
		return
	})
	return tokens, err
}

// SamplerParams choose the next token (m40_sampler_params).
type SamplerParams struct {
	Temperature   float32 // 0: greedy
	TopK          int
	TopP, MinP    float32
	RepeatPenalty float32
	RepeatLastN   int
	Seed          uint64
}

// DefaultSampler is the library's default sampling.
func DefaultSampler() SamplerParams {
	p := C.m40_sampler_default_params()
	return SamplerParams{
		Temperature: float32(p.temperature), TopK: int(p.top_k), TopP: float32(p.top_p),
		MinP: float32(p.min_p), RepeatPenalty: float32(p.repeat_penalty),
		RepeatLastN: int(p.repeat_last_n), Seed: uint64(p.seed),
	}
}

// Greedy always takes the most likely token.
func Greedy() SamplerParams {
	p := DefaultSampler()
	p.Temperature = 0
	return p
}

func (s SamplerParams) c() C.struct_m40_sampler_params {
	return C.struct_m40_sampler_params{
		temperature: C.float(s.Temperature), top_k: C.int32_t(s.TopK), top_p: C.float(s.TopP),
		min_p: C.float(s.MinP), repeat_penalty: C.float(s.RepeatPenalty),
		repeat_last_n: C.int32_t(s.RepeatLastN), seed: C.uint64_t(s.Seed),
	}
}

// Session is one conversation's state (its KV cache); one goroutine at a time.
type Session struct {
	mu    sync.Mutex
	ptr   *C.struct_m40_session
	model *Model
}

// NewSession starts a session of nCtx tokens (0: min(training context, 4096)).
func (m *Model) NewSession(nCtx int) (*Session, error) {
	if nCtx < 0 {
		return nil, &Error{Status: InvalidArgument, Message: fmt.Sprintf("NewSession: nCtx %d is negative", nCtx)}
	}
	var s *Session
	err := m.use(func(p *C.struct_m40_model) error {
		params := C.m40_session_default_params()
		params.n_ctx = C.uint32_t(nCtx)
		var ptr *C.struct_m40_session
		if err := call(func() C.enum_m40_status { return C.m40_session_new(p, &params, &ptr) }); err != nil {
			return err
		}
		s = &Session{ptr: ptr, model: m}
		runtime.SetFinalizer(s, (*Session).Close)
		return nil
	})
	return s, err
}

// Close releases the session; closing twice is a no-op.
func (s *Session) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ptr == nil {
		return nil
	}
	err := call(func() C.enum_m40_status { return C.m40_free(unsafe.Pointer(s.ptr)) })
	s.ptr = nil
	runtime.SetFinalizer(s, nil)
	return err
}

func (s *Session) use(f func(*C.struct_m40_session) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ptr == nil {
		return &Error{Status: InvalidArgument, Message: "session: " + errClosed}
	}
	return f(s.ptr)
}

// NPast is the number of tokens the session holds.
func (s *Session) NPast() int {
	n := 0
	_ = s.use(func(p *C.struct_m40_session) error { n = int(C.m40_session_n_past(p)); return nil })
	return n
}

// MemoryBytes is the memory the session's caches hold: keys and values for
// n_ctx positions of each attention layer, and a hybrid model's
// linear-attention states (m40_session_memory_bytes).
func (s *Session) MemoryBytes() uint64 {
	var n uint64
	_ = s.use(func(p *C.struct_m40_session) error { n = uint64(C.m40_session_memory_bytes(p)); return nil })
	return n
}

// Reset empties the session.
func (s *Session) Reset() error {
	return s.use(func(p *C.struct_m40_session) error {
		return call(func() C.enum_m40_status { return C.m40_session_reset(p) })
	})
}

// ResetSampler forgets the sampler's random state: the next Sample seeds it
// from its seed, as in a new session (m40_session_reset_sampler).
func (s *Session) ResetSampler() error {
	return s.use(func(p *C.struct_m40_session) error {
		return call(func() C.enum_m40_status { return C.m40_session_reset_sampler(p) })
	})
}

// Truncate keeps the first nKeep tokens and forgets the rest.
func (s *Session) Truncate(nKeep int) error {
	if nKeep < 0 {
		return &Error{Status: InvalidArgument, Message: fmt.Sprintf("Truncate: nKeep %d is negative", nKeep)}
	}
	return s.use(func(p *C.struct_m40_session) error {
		return call(func() C.enum_m40_status { return C.m40_session_truncate(p, C.uint32_t(nKeep)) })
	})
}

// Logits copies the next-token logits into out (grown to the vocabulary's
// size) and returns it; an error before the first decode.
func (s *Session) Logits(out []float32) ([]float32, error) {
	err := s.use(func(p *C.struct_m40_session) error {
		ptr := C.m40_logits(p)
		if ptr == nil {
			return &Error{Status: InvalidArgument, Message: "the session has no logits (nothing decoded since its start, reset or truncate)"}
		}
		n := s.model.NVocab()
		if cap(out) < n {
			out = make([]float32, n)
		}
		out = out[:n]
		copy(out, unsafe.Slice((*float32)(unsafe.Pointer(ptr)), n))
		return nil
	})
	return out, err
}

// Decode appends tokens and runs the model over them.
func (s *Session) Decode(tokens []Token) error {
	if len(tokens) == 0 {
		return nil
	}
	return s.use(func(p *C.struct_m40_session) error {
		return call(func() C.enum_m40_status {
			return C.m40_decode(p, (*C.m40_token)(unsafe.Pointer(&tokens[0])), C.size_t(len(tokens)))
		})
	})
}

// DecodeNoLogits appends tokens like Decode but computes no logits (the
// output layer is skipped): for the leading pieces of a prompt decoded a
// piece at a time; the last piece goes through Decode.
func (s *Session) DecodeNoLogits(tokens []Token) error {
	if len(tokens) == 0 {
		return nil
	}
	return s.use(func(p *C.struct_m40_session) error {
		return call(func() C.enum_m40_status {
			return C.m40_decode_no_logits(p, (*C.m40_token)(unsafe.Pointer(&tokens[0])), C.size_t(len(tokens)))
		})
	})
}

// Sample picks the next token from the last decode's logits.
func (s *Session) Sample(params SamplerParams) (Token, error) {
	var t C.m40_token
	err := s.use(func(p *C.struct_m40_session) error {
		cp := params.c()
		return call(func() C.enum_m40_status { return C.m40_sample(p, &cp, &t) })
	})
	return Token(t), err
}

// generation is what the C callback reaches through its cgo.Handle.
type generation struct {
	onPiece func(piece string) bool
	panic   interface{}
}

//export m40goPiece
func m40goPiece(userData unsafe.Pointer, piece *C.char, n C.size_t, token C.m40_token) (keepGoing C.bool) {
	g := (*(*cgo.Handle)(userData)).Value().(*generation)
	// A panic must not unwind through the library: kept and re-raised by Generate.
	defer func() {
		if r := recover(); r != nil {
			g.panic = r
			keepGoing = false
		}
	}()
	return C.bool(g.onPiece(C.GoStringN(piece, C.int(n))))
}

// Generate decodes the prompt, then samples up to maxTokens, calling
// onPiece with each piece of text (whole UTF-8 characters; only the last
// may end inside one, when the token limit cuts it) as it comes;
// onPiece returns false to stop. A panic in onPiece stops the generation
// and is re-raised here. onPiece must not call methods of this session (it
// holds the session's lock).
func (s *Session) Generate(prompt string, params SamplerParams, maxTokens int, onPiece func(piece string) bool) error {
	if maxTokens < 0 {
		return &Error{Status: InvalidArgument, Message: fmt.Sprintf("Generate: maxTokens %d is negative", maxTokens)}
	}
	g := &generation{onPiece: onPiece}
	handle := cgo.NewHandle(g)
	defer handle.Delete()
	err := s.use(func(p *C.struct_m40_session) error {
		cprompt := C.CString(prompt)
		defer C.free(unsafe.Pointer(cprompt))
		cp := params.c()
		h := (*cgo.Handle)(C.malloc(C.size_t(unsafe.Sizeof(handle))))
		defer C.free(unsafe.Pointer(h))
		*h = handle
		return call(func() C.enum_m40_status {
			return C.m40_generate(p, cprompt, C.size_t(len(prompt)), &cp, C.uint32_t(maxTokens),
				C.m40_piece_fn(C.m40go_on_piece), unsafe.Pointer(h))
		})
	})
	if g.panic != nil {
		panic(g.panic)
	}
	return err
}

// DecodeBatch decodes tokens[i] in sessions[i], all in one pass of the model
// (the sessions must share it).
func DecodeBatch(sessions []*Session, tokens []Token) error {
	if len(sessions) == 0 && len(tokens) == 0 {
		return nil
	}
	return withBatch("DecodeBatch", sessions, tokens, func(list **C.struct_m40_session) C.enum_m40_status {
		return C.m40_decode_batch(list, (*C.m40_token)(unsafe.Pointer(&tokens[0])), C.size_t(len(tokens)))
	})
}

// DecodeBatchSample decodes tokens[i] in sessions[i] in one pass, then
// samples each session's next token with params[i] (m40_decode_batch_sample):
// the tokens Sample would pick, without the logits leaving the device (the
// sessions hold none afterwards). params nil: the default sampler for all.
func DecodeBatchSample(sessions []*Session, tokens []Token, params []SamplerParams) ([]Token, error) {
	if params != nil && len(params) != len(sessions) {
		return nil, &Error{Status: InvalidArgument, Message: fmt.Sprintf("DecodeBatchSample: %d sessions but %d sampler parameters", len(sessions), len(params))}
	}
	if len(sessions) == 0 && len(tokens) == 0 {
		return nil, nil
	}
	next := make([]Token, len(sessions))
	err := withBatch("DecodeBatchSample", sessions, tokens, func(list **C.struct_m40_session) C.enum_m40_status {
		var cparams *C.struct_m40_sampler_params
		if params != nil {
			mem := C.malloc(C.size_t(len(params)) * C.size_t(unsafe.Sizeof(C.struct_m40_sampler_params{})))
			defer C.free(mem)
			list := unsafe.Slice((*C.struct_m40_sampler_params)(mem), len(params))
			for i, p := range params {
				list[i] = p.c()
			}
			cparams = &list[0]
		}
		out := C.malloc(C.size_t(len(sessions)) * C.size_t(unsafe.Sizeof(C.m40_token(0))))
		defer C.free(out)
		status := C.m40_decode_batch_sample(list, (*C.m40_token)(unsafe.Pointer(&tokens[0])), C.size_t(len(tokens)),
			cparams, (*C.m40_token)(out))
		if status == C.M40_OK {
			for i, t := range unsafe.Slice((*C.m40_token)(out), len(sessions)) {
				next[i] = Token(t)
			}
		}
		return status
	})
	if err != nil {
		return nil, err
	}
	return next, nil
}

// withBatch runs f on the C handles of sessions, each locked for the call,
// after the checks every batch call makes.
func withBatch(what string, sessions []*Session, tokens []Token, f func(list **C.struct_m40_session) C.enum_m40_status) error {
	if len(sessions) != len(tokens) {
		return &Error{Status: InvalidArgument, Message: fmt.Sprintf("%s: %d sessions but %d tokens", what, len(sessions), len(tokens))}
	}
	// Locked in address order, so that concurrent batches never wait on
	// each other in a cycle; a session twice is an argument error.
	ordered := append([]*Session(nil), sessions...)
	sort.Slice(ordered, func(i, k int) bool {
		return uintptr(unsafe.Pointer(ordered[i])) < uintptr(unsafe.Pointer(ordered[k]))
	})
	for i, s := range ordered {
		if i > 0 && ordered[i-1] == s {
			return &Error{Status: InvalidArgument, Message: what + ": a session appears twice"}
		}
	}
	for _, s := range ordered {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.ptr == nil {
			return &Error{Status: InvalidArgument, Message: "session: " + errClosed}
		}
	}
	ptrs := C.malloc(C.size_t(len(sessions)) * C.size_t(unsafe.Sizeof(uintptr(0))))
	defer C.free(ptrs)
	list := unsafe.Slice((**C.struct_m40_session)(ptrs), len(sessions))
	for i, s := range sessions {
		list[i] = s.ptr
	}
	return call(func() C.enum_m40_status { return f(&list[0]) })
}

// IsStatus reports whether err is an *Error with the given status.
func IsStatus(err error, status Status) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == status
}
