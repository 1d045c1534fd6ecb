package idempotency

import "strings"

// MaxKeyChars is the longest key the extension accepts.
const MaxKeyChars = 255

// KeyError says why an Idempotency-Key header was refused; Missing tells the two problems
// apart (idempotency-key-missing, idempotency-key-invalid).
type KeyError struct {
	Missing bool
	Reason  string
}

func (e *KeyError) Error() string { return "Idempotency-Key: " + e.Reason }

// ParseKey reads the key from the values of every Idempotency-Key field line of a request
// (contract/contract.json's key_header): exactly one line, holding an RFC 8941 sf-string
// ("...", with \" and \\ the only escapes) or, for clients that send it bare, a bare value of
// token characters (an sf-token, or a bare UUID); 1 to 255 printable ASCII characters after
// unquoting. Parameters, lists, spaces and control characters are refused.
func ParseKey(values []string) (string, error) {
	switch {
	case len(values) == 0:
		return "", &KeyError{Missing: true, Reason: "the request has no Idempotency-Key header"}
	case len(values) > 1:
		return "", &KeyError{Reason: "the Idempotency-Key header must appear once"}
	}
	raw := strings.Trim(values[0], " \t")
	var key string
	if strings.HasPrefix(raw, `"`) {
		var ok bool
		if key, ok = unquote(raw); !ok {
			return "", &KeyError{Reason: `the Idempotency-Key is not a well-formed quoted string (RFC 8941 sf-string), e.g. "8e03978e-40d5"`}
		}
	} else {
		for i := 0; i < len(raw); i++ {
			if !bareChar(raw[i]) {
				return "", &KeyError{Reason: `a bare Idempotency-Key may hold letters, digits and !#$%&'*+-.^_` + "`" + `|~:/ only; quote it: "..."`}
			}
		}
		key = raw
	}
	if len(key) == 0 || len(key) > MaxKeyChars {
		return "", &KeyError{Reason: "the Idempotency-Key must hold 1 to 255 characters"}
	}
	return key, nil
}

// unquote parses a whole field value as one RFC 8941 sf-string: printable ASCII, escapes \"
// and \\ only, nothing after the closing quote.
func unquote(s string) (string, bool) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\':
			i++
			if i >= len(s) || (s[i] != '"' && s[i] != '\\') {
				return "", false
			}
			b.WriteByte(s[i])
		case c == '"':
			return b.String(), i == len(s)-1
		case c < 0x20 || c > 0x7e:
			return "", false
		default:
			b.WriteByte(c)
		}
	}
	return "", false // no closing quote
}

// bareChar: RFC 9110 tchar, plus ':' and '/' (RFC 8941 sf-token's extra characters).
func bareChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0
}
