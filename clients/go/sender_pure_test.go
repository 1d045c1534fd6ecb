package idempotency

import (
	"context"
	"testing"
	"time"
)

func TestKeyHeader(t *testing.T) {
	cases := map[string]string{
		"k-1":      `"k-1"`,
		`a"b\c`:    `"a\"b\\c"`,
		"8e03978e": `"8e03978e"`,
	}
	for key, want := range cases {
		if got := KeyHeader(key); got != want {
			t.Errorf("KeyHeader(%q) = %s, want %s", key, got, want)
		}
		if back, err := ParseKey([]string{KeyHeader(key)}); err != nil || back != key {
			t.Errorf("ParseKey(KeyHeader(%q)) = %q, %v", key, back, err)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		value string
		want  time.Duration
		ok    bool
	}{
		{"7", 7 * time.Second, true},
		{" 0 ", 0, true},
		{"Thu, 03 Dec 2026 12:00:30 GMT", 30 * time.Second, true},
		{"Thu, 03 Dec 2026 11:00:00 GMT", 0, true}, // in the past
		{"99999999999999999999", time.Duration(1<<63-1) / time.Second * time.Second, true},
		{"soon", 0, false},
		{"-5", 0, false},
		{"1.5", 0, false},
		{"", 0, false},
	}
	for _, c := range cases {
		got, ok := ParseRetryAfter(c.value, now)
		if got != c.want || ok != c.ok {
			t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", c.value, got, ok, c.want, c.ok)
		}
	}
}

func TestNewSenderOptions(t *testing.T) {
	send := func(context.Context, Attempt) Answer { return Answer{Status: 201} }
	if _, err := NewSender(nil, SenderOptions{}); err == nil {
		t.Error("a sender without URLs or Send was accepted")
	}
	if _, err := NewSender(nil, SenderOptions{Send: send, Timeout: 30 * time.Second, Lease: 10 * time.Second}); err == nil {
		t.Error("a timeout longer than the lease was accepted")
	}
	if _, err := NewSender(nil, SenderOptions{Send: send, Lease: 5 * time.Second}); err == nil {
		t.Error("the default timeout (10 s) with a 5 s lease was accepted")
	}
	s, err := NewSender(nil, SenderOptions{URLs: map[string]string{"t": "http://127.0.0.1:9/"}})
	if err != nil || s.o.Timeout != 10*time.Second || s.o.Lease != 30*time.Second || s.o.Concurrency != 4 ||
		s.o.PollInterval != time.Second {
		t.Errorf("defaults: %+v, %v", s, err)
	}
}
