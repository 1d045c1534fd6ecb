package idempotency

import (
	"bytes"
	"net/http"
	"testing"
)

// The stored form of a body, read back as the database gives it (JSON text), is the body.
func TestBodyStoredAndSentBack(t *testing.T) {
	cases := []struct {
		name, contentType string
		body              []byte
		mark              string
	}{
		{"JSON", "application/json", []byte(`{"id":"ch_1","amount":500}`), ""},
		{"problem+json", "application/problem+json; charset=utf-8", []byte(`{"status":402}`), ""},
		{"JSON type, not JSON", "application/json", []byte(`{"id":`), "text"},
		{"JSON holding \\u0000", "application/json", []byte(`{"a":"\u0000"}`), "text"},
		{"text", "text/plain", []byte("ok <&> \u00e9\n"), "text"},
		{"no content type", "", []byte("plain"), "text"},
		{"not UTF-8", "application/octet-stream", []byte{0xff, 0x00, 0x01}, "base64"},
		{"NUL in text", "text/plain", []byte("a\x00b"), "base64"},
	}
	for _, c := range cases {
		h := http.Header{}
		if c.contentType != "" {
			h.Set("Content-Type", c.contentType)
		}
		h.Set("Location", "/x/1")
		h.Set("X-Other", "not kept")
		body, stored := toStore(h, c.body, []string{"Location", "Content-Type"})
		if stored[encodingMark] != c.mark {
			t.Errorf("%s: stored as %q, want %q", c.name, stored[encodingMark], c.mark)
		}
		if _, ok := stored["X-Other"]; ok || stored["Location"] != "/x/1" {
			t.Errorf("%s: stored headers %v: want Location only (and Content-Type)", c.name, stored)
		}
		header, sent, err := fromStore(stored, body)
		if err != nil || !bytes.Equal(sent, c.body) {
			t.Errorf("%s: sent back %q, %v; want %q", c.name, sent, err, c.body)
		}
		if header.Get(encodingMark) != "" || header.Get("Location") != "/x/1" {
			t.Errorf("%s: headers sent back %v", c.name, header)
		}
	}
}

func TestFromStoreRefusesUnknownEncoding(t *testing.T) {
	if _, _, err := fromStore(map[string]string{encodingMark: "rot13"}, []byte(`"x"`)); err == nil {
		t.Error("an unknown encoding mark was accepted")
	}
}
