package idempotency

import (
	"strings"
	"testing"
)

func TestParseKeyAccepts(t *testing.T) {
	cases := []struct{ name, value, key string }{
		{"quoted string", `"8e03978e-40d5-43e8"`, "8e03978e-40d5-43e8"},
		{"bare token", "tok-1:a/b", "tok-1:a/b"},
		{"bare UUID starting with a digit", "8e03978e-40d5", "8e03978e-40d5"},
		{"escapes undone", `"q\"uo\\te"`, `q"uo\te`},
		{"spaces inside quotes", `"a b"`, "a b"},
		{"surrounding white space", "  \"k\"\t", "k"},
		{"255 characters", `"` + strings.Repeat("k", 255) + `"`, strings.Repeat("k", 255)},
	}
	for _, c := range cases {
		got, err := ParseKey([]string{c.value})
		if err != nil || got != c.key {
			t.Errorf("%s: ParseKey(%q) = %q, %v; want %q", c.name, c.value, got, err, c.key)
		}
	}
}

func TestParseKeyRefuses(t *testing.T) {
	cases := []struct{ name, value string }{
		{"empty quoted string", `""`},
		{"empty value", ""},
		{"256 characters quoted", `"` + strings.Repeat("k", 256) + `"`},
		{"256 characters bare", strings.Repeat("k", 256)},
		{"tab inside", "\"a\tb\""},
		{"control character", "\"a\x01b\""},
		{"no closing quote", `"abc`},
		{"parameters after the string", `"abc";p=1`},
		{"a list", `"a", "b"`},
		{"a bad escape", `"a\nb"`},
		{"a bare value with a space", "a b"},
		{"non-ASCII", "\"caf\u00e9\""},
		{"bare non-ASCII", "caf\u00e9"},
	}
	for _, c := range cases {
		got, err := ParseKey([]string{c.value})
		ke, ok := err.(*KeyError)
		if !ok || ke.Missing {
			t.Errorf("%s: ParseKey(%q) = %q, %v; want an invalid-key error", c.name, c.value, got, err)
		}
	}
}

func TestParseKeyFieldLines(t *testing.T) {
	if _, err := ParseKey(nil); err == nil || !err.(*KeyError).Missing {
		t.Errorf("no field line: %v, want a missing-key error", err)
	}
	if _, err := ParseKey([]string{`"a"`, `"a"`}); err == nil || err.(*KeyError).Missing {
		t.Errorf("two field lines: %v, want an invalid-key error", err)
	}
}
