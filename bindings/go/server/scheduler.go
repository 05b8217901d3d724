package server

import (
	"context"
	"math"
	"sort"
	"time"

	m40 "m40llm/bindings/go"
)

// event is what a job sends its request: text as it comes, then the end.
type event struct {
	choice    int
	text      string
	logprobs  []tokenLogprob
	finish    string // "stop" or "length" on a choice's last event
	err       string // a failure: the choice's last event
	done      bool   // the choice's last event
	generated int    // on the last event: the tokens the choice generated
}

// tokenLogprob is one generated token's log-probability and the most likely
// alternatives, from the logits it was sampled from.
type tokenLogprob struct {
	token   []byte
	logprob float32
	top     []alternative
	offset  int // where the token's text begins in the choice's text
}

type alternative struct {
	token   []byte
	logprob float32
}

// job is one choice of a request, generated in one session.
type job struct {
	ctx         context.Context
	choice      int
	prompt      []m40.Token
	maxTokens   int
	sampler     m40.SamplerParams
	topLogprobs int // -1: none asked for
	stop        stopper
	events      chan<- event // room for every event the job can send

	// Owned by the scheduler.
	slot      *slot
	fed       int // prompt tokens decoded
	generated int
	next      m40.Token
	nextLP    *tokenLogprob
	held      []byte // generated text not sent yet
	sent      int    // bytes of text sent
	heldLP    []tokenLogprob
}

// slot is a session the scheduler keeps and reuses: its KV cache holds
// `tokens`, so a request whose prompt begins the same way (a conversation's
// next turn) decodes only the rest.
type slot struct {
	session *m40.Session
	tokens  []m40.Token
	busy    bool
}

// schedule owns every session. Each round it admits waiting requests to free
// slots, decodes one chunk of one prompt, and steps every generating request
// with one batched decode; prompt chunks are sized to take about as long as
// a step, so a long prompt delays the streams in flight by a bounded factor.
func (s *Server) schedule() {
	defer s.finished.Done()
	var waiting, filling, active []*job
	endAll := func(reason string) {
		for _, list := range [][]*job{waiting, filling, active} {
			for _, j := range list {
				s.end(j, reason)
			}
		}
		waiting, filling, active = nil, nil, nil
	}
	for {
		if len(waiting)+len(filling)+len(active) == 0 {
			select {
			case j := <-s.jobs:
				waiting = append(waiting, j)
			case <-s.stop:
				return
			}
		}
	take:
		for {
			select {
			case j := <-s.jobs:
				waiting = append(waiting, j)
			case <-s.stop:
				endAll(stopping)
				return
			default:
				break take
			}
		}
		waiting = s.assignSlots(waiting, &filling)

		if len(filling) > 0 {
			if j, ready := s.fillChunk(filling[0], len(active) > 0); ready || j == nil {
				filling = filling[1:]
				if j != nil {
					active = append(active, j)
				}
			}
		}
		active = s.step(active)
		s.metrics.queued.Store(int64(len(waiting)))
		s.metrics.activeSessions.Store(int64(len(filling) + len(active)))
	}
}

// assignSlots gives waiting jobs free slots, in order, and returns those
// still waiting.
func (s *Server) assignSlots(waiting []*job, filling *[]*job) []*job {
	for len(waiting) > 0 {
		j := waiting[0]
		if j.ctx.Err() != nil {
			s.end(j, "client disconnected")
			waiting = waiting[1:]
			continue
		}
		sl, err := s.freeSlot(j.prompt)
		if err != nil {
			s.end(j, err.Error())
			waiting = waiting[1:]
			continue
		}
		if sl == nil {
			break
		}
		sl.busy = true
		j.slot = sl
		j.fed = len(sl.tokens)
		*filling = append(*filling, j)
		waiting = waiting[1:]
	}
	return waiting
}

// freeSlot takes the free slot whose cache shares the longest beginning
// with the prompt (truncated to it), or makes a new one while there are
// fewer than the configured number; nil when all are busy.
func (s *Server) freeSlot(prompt []m40.Token) (*slot, error) {
	var best *slot
	bestShared := -1
	for _, sl := range s.slots {
		if sl.busy {
			continue
		}
		shared := 0
		for shared < len(sl.tokens) && shared < len(prompt)-1 && sl.tokens[shared] == prompt[shared] {
			shared++
		}
		if shared > bestShared {
			best, bestShared = sl, shared
		}
	}
	// A new session rather than a free one that shares nothing.
	if bestShared <= 0 && len(s.slots) < s.cfg.Sessions {
		session, err := s.model.NewSession(s.cfg.NCtx)
		if err != nil {
			return nil, err
		}
		sl := &slot{session: session}
		s.slots = append(s.slots, sl)
		return sl, nil
	}
	if best == nil {
		return nil, nil
	}
	if err := best.session.Truncate(bestShared); err != nil {
		if err := best.session.Reset(); err != nil {
			return nil, err
		}
		bestShared = 0
	}
	// Sampling starts as in a new session: the same seed, the same tokens.
	if err := best.session.ResetSampler(); err != nil {
		return nil, err
	}
	best.tokens = best.tokens[:bestShared]
	s.metrics.cachedPromptTokens.Add(int64(bestShared))
	return best, nil
}

// fillChunk decodes the next chunk of a job's prompt; when the prompt is in,
// it samples the first token and reports the job ready. A job that failed
// or whose client left is ended and returned as nil.
func (s *Server) fillChunk(j *job, streaming bool) (*job, bool) {
	if j.ctx.Err() != nil {
		s.end(j, "client disconnected")
		return nil, true
	}
	n := len(j.prompt) - j.fed
	if chunk := s.chunkTokens(streaming); n > chunk {
		n = chunk
	}
	start := time.Now()
	decode := j.slot.session.Decode
	if j.fed+n < len(j.prompt) {
		decode = j.slot.session.DecodeNoLogits // logits only after the last piece
	}
	if err := decode(j.prompt[j.fed : j.fed+n]); err != nil {
		s.end(j, err.Error())
		return nil, true
	}
	s.notePrefill(n, time.Since(start))
	j.slot.tokens = append(j.slot.tokens, j.prompt[j.fed:j.fed+n]...)
	j.fed += n
	s.metrics.promptChunks.Add(1)
	if j.fed < len(j.prompt) {
		return j, false
	}
	if err := s.sample(j); err != nil {
		s.end(j, err.Error())
		return nil, true
	}
	return j, true
}

// step sends each active job's sampled token and decodes the next tokens of
// those that go on, all in one batch; it returns the jobs still active.
func (s *Server) step(active []*job) []*job {
	kept := active[:0]
	var sessions []*m40.Session
	var tokens []m40.Token
	for _, j := range active {
		if done, reason := s.emit(j); done {
			s.end(j, reason)
			continue
		}
		kept = append(kept, j)
		sessions = append(sessions, j.slot.session)
		tokens = append(tokens, j.next)
	}
	active = kept
	if len(active) == 0 {
		return active
	}
	if int32(len(active)) > s.maxBatch.Load() {
		s.maxBatch.Store(int32(len(active)))
	}
	// Sampled in the batched call (only each sampler's candidates leave the
	// device) unless a job needs its logits for log-probabilities.
	samplers := make([]m40.SamplerParams, 0, len(active))
	for _, j := range active {
		if j.topLogprobs >= 0 {
			samplers = nil
			break
		}
		samplers = append(samplers, j.sampler)
	}
	start := time.Now()
	var next []m40.Token
	var err error
	if samplers != nil {
		next, err = m40.DecodeBatchSample(sessions, tokens, samplers)
	} else {
		err = m40.DecodeBatch(sessions, tokens)
	}
	if err != nil {
		for _, j := range active {
			s.end(j, err.Error())
		}
		return active[:0]
	}
	s.noteStep(time.Since(start))
	kept = active[:0]
	for i, j := range active {
		j.slot.tokens = append(j.slot.tokens, j.next)
		if next != nil {
			j.next = next[i]
		} else if err := s.sample(j); err != nil {
			s.end(j, err.Error())
			continue
		}
		kept = append(kept, j)
	}
	return kept
}

// sample picks the job's next token from its session's logits, with its
// log-probabilities when the request asked for them.
func (s *Server) sample(j *job) error {
	next, err := j.slot.session.Sample(j.sampler)
	if err != nil {
		return err
	}
	j.next, j.nextLP = next, nil
	if j.topLogprobs < 0 {
		return nil
	}
	s.logits, err = j.slot.session.Logits(s.logits)
	if err != nil {
		return err
	}
	chosen, top := logSoftmax(s.logits, next, j.topLogprobs)
	lp := &tokenLogprob{token: []byte(s.pieces[next]), logprob: chosen}
	for _, alt := range top {
		lp.top = append(lp.top, alternative{token: []byte(s.pieces[alt.id]), logprob: alt.logprob})
	}
	j.nextLP = lp
	return nil
}

type rankedToken struct {
	id      int
	logprob float32
}

// logSoftmax is the log-probability of `chosen` and of the k most likely
// tokens under the model's distribution (the logits before sampling's
// temperature and filters), in float64.
func logSoftmax(logits []float32, chosen m40.Token, k int) (float32, []rankedToken) {
	maxLogit := math.Inf(-1)
	for _, x := range logits {
		maxLogit = math.Max(maxLogit, float64(x))
	}
	sum := 0.0
	for _, x := range logits {
		sum += math.Exp(float64(x) - maxLogit)
	}
	logZ := maxLogit + math.Log(sum)
	ids := make([]int, 0, k+1)
	for i, x := range logits {
		if k == 0 || len(ids) == k && x <= logits[ids[k-1]] {
			continue
		}
		at := sort.Search(len(ids), func(n int) bool { return logits[ids[n]] < x })
		ids = append(ids, 0)
		copy(ids[at+1:], ids[at:])
		ids[at] = i
		if len(ids) > k {
			ids = ids[:k]
		}
	}
	top := make([]rankedToken, len(ids))
	for n, id := range ids {
		top[n] = rankedToken{id, float32(float64(logits[id]) - logZ)}
	}
	return float32(float64(logits[chosen]) - logZ), top
}

// emit sends the job's sampled token as text, unless the generation is over
// (end of generation, a stop string, the token budget, or the client gone).
// Text that may begin a stop string or is an incomplete character waits.
func (s *Server) emit(j *job) (done bool, reason string) {
	if j.ctx.Err() != nil {
		return true, "client disconnected"
	}
	if s.eog[j.next] {
		return true, "stop"
	}
	piece := s.pieces[j.next]
	if j.nextLP != nil {
		j.nextLP.offset = j.sent + len(j.held)
		j.heldLP = append(j.heldLP, *j.nextLP)
	}
	j.held = append(j.held, piece...)
	j.generated++
	s.metrics.generatedTokens.Add(1)
	// At the end, `end` sends what is held.
	if at, found := j.stop.find(j.held); found {
		j.held = j.held[:at]
		return true, "stop"
	}
	if j.generated >= j.maxTokens {
		return true, "length"
	}
	s.send(j, j.stop.sendable(j.held))
	return false, ""
}

// send passes the first n held bytes to the request, with the
// log-probabilities of the tokens whose text begins in them.
func (s *Server) send(j *job, n int) {
	if n > len(j.held) {
		n = len(j.held)
	}
	end := j.sent + n
	lps := 0
	for lps < len(j.heldLP) && j.heldLP[lps].offset < end {
		lps++
	}
	if n == 0 && lps == 0 {
		return
	}
	ev := event{choice: j.choice, text: string(j.held[:n])}
	if lps > 0 {
		ev.logprobs = append([]tokenLogprob(nil), j.heldLP[:lps]...)
		j.heldLP = j.heldLP[lps:]
	}
	// Never blocks: the channel has room for an event per token and the end.
	j.events <- ev
	j.held = j.held[n:]
	j.sent = end
}

// end finishes a job: "stop" and "length" are normal ends (held text that
// is not part of a stop string goes out), anything else a failure.
func (s *Server) end(j *job, reason string) {
	if j.slot != nil {
		j.slot.busy = false
		j.slot = nil
	}
	if reason == "stop" || reason == "length" {
		s.send(j, len(j.held))
		j.events <- event{choice: j.choice, finish: reason, done: true, generated: j.generated}
	} else {
		j.events <- event{choice: j.choice, err: reason, done: true, generated: j.generated}
	}
}

// chunkTokens is how many prompt tokens to decode before the next step:
// all of a prompt (up to 512) when nothing streams; otherwise as many as
// take about one decode step, at least 8.
func (s *Server) chunkTokens(streaming bool) int {
	if s.cfg.PromptChunk > 0 {
		return s.cfg.PromptChunk
	}
	if !streaming || s.perToken <= 0 || s.stepTime <= 0 {
		return 512
	}
	n := int(s.stepTime / s.perToken)
	if n < 8 {
		n = 8
	}
	if n > 512 {
		n = 512
	}
	return n
}

// notePrefill and noteStep keep moving averages of a prompt token's and a
// decode step's time.
func (s *Server) notePrefill(tokens int, took time.Duration) {
	if tokens < 1 {
		return
	}
	perToken := took.Seconds() / float64(tokens)
	if s.perToken == 0 {
		s.perToken = perToken
	} else {
		s.perToken += 0.3 * (perToken - s.perToken)
	}
}

func (s *Server) noteStep(took time.Duration) {
	if s.stepTime == 0 {
		s.stepTime = took.Seconds()
	} else {
		s.stepTime += 0.3 * (took.Seconds() - s.stepTime)
	}
}
