package idempotency

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// contract/contract.json, the one description of the HTTP side of the contract: this
// package's problems and outcome answers are checked against it, so a change there fails here.
type contractFile struct {
	ProblemTypePrefix string `json:"problem_type_prefix"`
	Outcomes          []struct {
		Outcome    string          `json:"outcome"`
		HTTPStatus json.RawMessage `json:"http_status"`
		Problem    *string         `json:"problem"`
	} `json:"outcomes"`
	Problems []struct {
		Slug    string   `json:"slug"`
		Status  int      `json:"status"`
		Title   string   `json:"title"`
		Detail  string   `json:"detail"`
		Headers []string `json:"headers"`
	} `json:"problems"`
	KeyHeader struct {
		Name     string `json:"name"`
		MaxChars int    `json:"max_chars"`
	} `json:"key_header"`
	RefusedStatuses struct {
		Statuses []int `json:"statuses"`
	} `json:"refused_statuses"`
}

func readContract(t *testing.T) contractFile {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "contract", "contract.json"))
	if errors.Is(err, fs.ErrNotExist) {
		t.Skip("contract/contract.json is not here: the module is outside its repository (as published)")
	}
	if err != nil {
		t.Fatalf("contract/contract.json: %v", err)
	}
	var c contractFile
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatalf("contract/contract.json: %v", err)
	}
	return c
}

func TestContractProblemTypePrefix(t *testing.T) {
	if c := readContract(t); c.ProblemTypePrefix != ProblemTypePrefix {
		t.Errorf("ProblemTypePrefix = %q, contract.json says %q", ProblemTypePrefix, c.ProblemTypePrefix)
	}
}

func TestContractProblems(t *testing.T) {
	c := readContract(t)
	seen := map[string]bool{}
	for _, want := range c.Problems {
		seen[want.Slug] = true
		got, ok := problems[want.Slug]
		if !ok {
			t.Errorf("problem %s: missing from problems", want.Slug)
			continue
		}
		if got.status != want.Status || got.title != want.Title || got.detail != want.Detail {
			t.Errorf("problem %s: ours %d %q %q, contract.json %d %q %q", want.Slug, got.status, got.title,
				got.detail, want.Status, want.Title, want.Detail)
		}
		if got.retryAfter != slices.Contains(want.Headers, "Retry-After") {
			t.Errorf("problem %s: Retry-After %v, contract.json headers %v", want.Slug, got.retryAfter, want.Headers)
		}
		p := problemOf(want.Slug, 7)
		var doc map[string]any
		if err := json.Unmarshal(p.Body(), &doc); err != nil || doc["type"] != c.ProblemTypePrefix+want.Slug ||
			doc["status"] != float64(want.Status) || doc["title"] != want.Title || doc["detail"] != want.Detail {
			t.Errorf("problem %s: body %s", want.Slug, p.Body())
		}
	}
	for slug := range problems {
		if !seen[slug] {
			t.Errorf("problem %s: not in contract.json", slug)
		}
	}
}

func TestContractOutcomes(t *testing.T) {
	c := readContract(t)
	if len(c.Outcomes) == 0 {
		t.Fatal("contract.json lists no outcomes")
	}
	for _, o := range c.Outcomes {
		outcome, err := parseOutcome(o.Outcome)
		if err != nil {
			t.Errorf("outcome %s: %v", o.Outcome, err)
			continue
		}
		slug, answered := outcomeProblems[outcome]
		if o.Problem == nil {
			if answered {
				t.Errorf("outcome %s: answered with problem %s, contract.json has none", o.Outcome, slug)
			}
			continue
		}
		if slug != *o.Problem {
			t.Errorf("outcome %s: problem %q, contract.json %q", o.Outcome, slug, *o.Problem)
		}
		var status int
		if err := json.Unmarshal(o.HTTPStatus, &status); err != nil || problems[slug].status != status {
			t.Errorf("outcome %s: status %d, contract.json %s", o.Outcome, problems[slug].status, o.HTTPStatus)
		}
	}
}

func TestContractKeyHeader(t *testing.T) {
	c := readContract(t)
	if c.KeyHeader.Name != "Idempotency-Key" || c.KeyHeader.MaxChars != MaxKeyChars {
		t.Errorf("key header %q, %d characters; ours Idempotency-Key, %d", c.KeyHeader.Name, c.KeyHeader.MaxChars,
			MaxKeyChars)
	}
}

func TestContractRefusedStatuses(t *testing.T) {
	c := readContract(t)
	want := slices.Sorted(slices.Values(c.RefusedStatuses.Statuses))
	if len(want) == 0 {
		t.Fatal("contract.json lists no refused_statuses")
	}
	var got []int
	for status, refused := range RefusedStatuses {
		if refused {
			got = append(got, status)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("RefusedStatuses %v, contract.json's refused_statuses %v", got, want)
	}
}
