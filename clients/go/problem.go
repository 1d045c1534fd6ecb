package idempotency

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// ProblemTypePrefix + a slug is the type of every problem this package answers with
// (contract/contract.json; problem_test.go checks this file against it).
const ProblemTypePrefix = "urn:pg-idempotency:problem:"

// Problem is an RFC 9457 problem details answer. A Tenant function may return one as its
// error to answer at once (a 401, say), before anything is claimed.
type Problem struct {
	Status  int
	Type    string // "" is about:blank
	Title   string
	Detail  string
	Headers map[string]string
}

func (p *Problem) Error() string { return strconv.Itoa(p.Status) + " " + p.Title + ": " + p.Detail }

// Body is the problem+json document.
func (p *Problem) Body() []byte {
	typ := p.Type
	if typ == "" {
		typ = "about:blank"
	}
	b, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail,omitempty"`
	}{typ, p.Title, p.Status, p.Detail})
	return b
}

// WriteTo sends the problem.
func (p *Problem) WriteTo(w http.ResponseWriter) {
	for name, value := range p.Headers {
		w.Header().Set(name, value)
	}
	body := p.Body()
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}

// The problems of the contract, by slug. retryAfter marks those sent with Retry-After.
type problemSpec struct {
	status        int
	title, detail string
	retryAfter    bool
}

const (
	slugKeyMissing  = "idempotency-key-missing"
	slugKeyInvalid  = "idempotency-key-invalid"
	slugInProgress  = "idempotency-key-in-progress"
	slugSuperseded  = "idempotency-key-superseded"
	slugReused      = "idempotency-key-reused"
	slugExpired     = "idempotency-key-expired"
	slugUnavailable = "service-unavailable"
	slugInternal    = "internal-error"
)

var problems = map[string]problemSpec{
	slugKeyMissing: {400, "Idempotency-Key missing", "This request requires an Idempotency-Key header.", false},
	slugKeyInvalid: {400, "Idempotency-Key invalid",
		"The Idempotency-Key header must appear once and hold 1 to 255 characters, none of them control characters.", false},
	slugInProgress: {409, "Request in progress",
		"A request with this Idempotency-Key is still being processed. Retry later.", true},
	slugSuperseded: {409, "Request taken over",
		"This attempt lost its claim on the Idempotency-Key to a later one. Retry to get the result.", true},
	slugReused: {422, "Idempotency-Key reused",
		"This Idempotency-Key was used with a different request payload. Use a new key for a new request.", false},
	slugExpired: {410, "Idempotency-Key expired",
		"This Idempotency-Key was used and its stored response has expired. Use a new key.", false},
	slugUnavailable: {503, "Service unavailable", "The database could not be reached; nothing was done. Retry later.", true},
	slugInternal:    {500, "Internal server error", "The request failed.", false},
}

// The outcomes answered with a problem (the others run the handler or replay).
var outcomeProblems = map[Outcome]string{
	InProgress: slugInProgress,
	Mismatch:   slugReused,
	Expired:    slugExpired,
}

// problemOf builds the contract's problem; retryAfter (seconds, at least 1) is used when the
// problem carries Retry-After.
func problemOf(slug string, retryAfter int) *Problem {
	spec, ok := problems[slug]
	if !ok {
		panic("idempotency: no problem " + slug)
	}
	p := &Problem{Status: spec.status, Type: ProblemTypePrefix + slug, Title: spec.title, Detail: spec.detail}
	if spec.retryAfter {
		p.Headers = map[string]string{"Retry-After": strconv.Itoa(max(1, retryAfter))}
	}
	return p
}
