package server

import (
	"bytes"

	m40 "m40llm/bindings/go"
)

// stopper finds a request's stop strings in generated text, holding back
// what may still become one so that no part of a stop string is ever sent.
type stopper struct {
	stops [][]byte
}

// find returns where the earliest stop string begins in text.
func (s *stopper) find(text []byte) (int, bool) {
	at, found := len(text), false
	for _, stop := range s.stops {
		if i := bytes.Index(text, stop); i >= 0 && i < at {
			at, found = i, true
		}
	}
	return at, found
}

// sendable is how much of text can go out now: all of it but a trailing
// incomplete UTF-8 character and the longest suffix that begins a stop
// string.
func (s *stopper) sendable(text []byte) int {
	keep := 0
	for _, stop := range s.stops {
		for n := len(stop) - 1; n > keep; n-- {
			if n <= len(text) && bytes.HasSuffix(text, stop[:n]) {
				keep = n
				break
			}
		}
	}
	cut := len(text) - keep
	return m40.CompleteUTF8(text[:cut])
}
