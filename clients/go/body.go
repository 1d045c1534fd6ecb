package idempotency

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"strings"
	"unicode/utf8"
)

// How responses are stored and sent again, byte for byte. No I/O here.
//
// A JSON body (a JSON content type, JSON that jsonb takes) is stored as jsonb and sent as
// jsonb prints it, the first time and on every replay alike. Any other body is stored as a
// JSON string: its text, or the base64 of its bytes when they are not UTF-8 or hold NUL; the
// stored headers then carry encodingMark, which is not a valid header name (so it never
// collides with one) and is never sent.
const encodingMark = ":body-encoding"

func isJSONType(contentType string) bool {
	media, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return media == "application/json" || strings.HasSuffix(media, "+json")
}

// jsonbTakes: valid JSON without \u0000 (which jsonb refuses).
func jsonbTakes(body []byte) bool {
	return json.Valid(body) && !bytes.Contains(body, []byte(`\u0000`))
}

// toStore is the response as idem_complete takes it: the body as JSON text and the headers to
// keep (those in allow, named as allow spells them).
func toStore(header http.Header, body []byte, allow []string) ([]byte, map[string]string) {
	stored := map[string]string{}
	for _, name := range allow {
		if v := header.Get(name); v != "" {
			stored[name] = v
		}
	}
	if isJSONType(header.Get("Content-Type")) && jsonbTakes(body) {
		return body, stored
	}
	var text string
	if utf8.Valid(body) && bytes.IndexByte(body, 0) < 0 {
		text, stored[encodingMark] = string(body), "text"
	} else {
		text, stored[encodingMark] = base64.StdEncoding.EncodeToString(body), "base64"
	}
	asJSON, _ := json.Marshal(text)
	return asJSON, stored
}

// fromStore is the inverse: the headers to send and the body bytes, from the stored headers
// and the stored body as jsonb prints it.
func fromStore(stored map[string]string, storedBody []byte) (http.Header, []byte, error) {
	header := http.Header{}
	for name, value := range stored {
		if name != encodingMark {
			header.Set(name, value)
		}
	}
	mark := stored[encodingMark]
	if mark == "" || storedBody == nil {
		return header, storedBody, nil
	}
	var text string
	if err := json.Unmarshal(storedBody, &text); err != nil {
		return nil, nil, fmt.Errorf("idempotency: stored %s body: %w", mark, err)
	}
	switch mark {
	case "text":
		return header, []byte(text), nil
	case "base64":
		b, err := base64.StdEncoding.DecodeString(text)
		return header, b, err
	}
	return nil, nil, fmt.Errorf("idempotency: unknown stored body encoding %q", mark)
}
