package idempotency

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
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

func TestNewSenderRefuses(t *testing.T) {
	send := func(context.Context, Attempt) Answer { return Answer{Status: 201} }
	budget := func(b float64) *float64 { return &b }
	refused := map[string]SenderOptions{
		"a timeout equal to the lease":  {Timeout: 1500 * time.Millisecond, Lease: 1500 * time.Millisecond},
		"a negative timeout":            {Timeout: -time.Second},
		"a negative lease":              {Timeout: time.Second, Lease: -time.Minute},
		"a negative budget":             {RetryBudget: budget(-0.1)},
		"a budget past the extension's": {RetryBudget: budget(MaxRetryBudget * 1.5)},
		"a budget that is NaN":          {RetryBudget: budget(math.NaN())},
		"a negative backoff base":       {BackoffBase: -time.Millisecond},
		"a backoff cap below 1µs":       {BackoffCap: 500 * time.Nanosecond},
		"a negative give-up":            {GiveUpAfter: -time.Hour},
		"a negative reconnect base":     {ReconnectBase: -time.Second},
	}
	for name, o := range refused {
		o.Send = send
		if _, err := NewSender(nil, o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	_, err := NewSender(nil, SenderOptions{Send: send, Timeout: 2 * time.Second, Lease: time.Second})
	if err == nil || !strings.Contains(err.Error(), "must be below Lease") {
		t.Errorf("a timeout above the lease: %v", err)
	}
	for _, b := range []float64{0, 0.1, MaxRetryBudget} {
		if _, err := NewSender(nil, SenderOptions{Send: send, RetryBudget: budget(b)}); err != nil {
			t.Errorf("budget %g: %v", b, err)
		}
	}
	s, err := NewSender(nil, SenderOptions{Send: send})
	if err != nil || s.settings != nil || s.o.ReconnectBase != 100*time.Millisecond || s.o.ReconnectCap != 5*time.Second {
		t.Errorf("defaults: %+v, %v", s, err)
	}
}

func TestSettingValues(t *testing.T) {
	budget := 0.25
	got, err := settingValues(&budget, 50*time.Millisecond, 90*time.Minute)
	want := []setting{{"idempotency.send_retry_budget", "0.25"},
		{"idempotency.send_backoff_base", "50000 microseconds"},
		{"idempotency.send_backoff_cap", "5400000000 microseconds"}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("settingValues = %v, %v; want %v", got, err, want)
	}
	zero, huge := 0.0, MaxRetryBudget
	for b, text := range map[*float64]string{&zero: "0", &huge: "1e+06"} {
		if got, err := settingValues(b, 0, 0); err != nil || !slices.Equal(got, []setting{{"idempotency.send_retry_budget", text}}) {
			t.Errorf("budget %g: %v, %v", *b, got, err)
		}
	}
	if got, err := settingValues(nil, 0, 0); got != nil || err != nil {
		t.Errorf("nothing given: %v, %v; want none (the database's)", got, err)
	}
	if got := setConfigSQL(2); got != "SELECT set_config($1::text, $2::text, true), set_config($3::text, $4::text, true)" {
		t.Errorf("setConfigSQL(2) = %s", got)
	}
}

func TestReconnectDelay(t *testing.T) {
	base, ceiling := 100*time.Millisecond, 5*time.Second
	cases := []struct {
		failures int
		random   float64
		want     time.Duration
	}{
		{1, 0, 0},
		{1, 0.5, 50 * time.Millisecond},
		{1, 0.999, 99900 * time.Microsecond},
		{2, 0.5, 100 * time.Millisecond},
		{4, 0.5, 400 * time.Millisecond},
		{6, 0.999, 3196800 * time.Microsecond}, // 3.2 s, below the cap
		{7, 0.5, 2500 * time.Millisecond},      // 6.4 s: the cap
		{1000, 0.999, 4995 * time.Millisecond},
		{0, 0.5, 50 * time.Millisecond}, // read as the first
	}
	for _, c := range cases {
		if got := reconnectDelay(c.failures, base, ceiling, c.random); got.Round(time.Microsecond) != c.want {
			t.Errorf("reconnectDelay(%d, random %g) = %v, want %v", c.failures, c.random, got, c.want)
		}
	}
}

func TestDBErrorCode(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: a real connection refused
	_, refused := pgconn.Connect(context.Background(), "postgres://postgres@"+addr+"/postgres?connect_timeout=5")
	terminated := &pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}
	cases := map[error]string{
		terminated:           "57P01",
		classify(terminated): "57P01",
		fmt.Errorf("record: %w", &pgconn.PgError{Code: "40P01"}): "40P01",
		refused:                      "ConnectError",
		io.ErrUnexpectedEOF:          "ConnectionLost",
		classify(io.EOF):             "ConnectionLost",
		context.DeadlineExceeded:     "Timeout",
		errors.New("something else"): "*errors.errorString",
	}
	for err, want := range cases {
		if got := dbErrorCode(err); got != want {
			t.Errorf("dbErrorCode(%v) = %s, want %s", err, got, want)
		}
	}
	if got := firstLine(errors.New("  one\ntwo\n")); got != "one" {
		t.Errorf("firstLine = %q", got)
	}
}
