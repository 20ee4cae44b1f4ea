package harness

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// Fault is what an API request a FaultRule matches meets.
type Fault int

const (
	// FaultRefused answers with Code (500, 409, 429, ...) without sending the
	// request on: nothing is written.
	FaultRefused Fault = iota
	// FaultTimeout waits Delay and fails as a client timeout would, without
	// sending the request on: nothing is written.
	FaultTimeout
	// FaultAnswerLost sends the request on, so that the API server applies it,
	// and then fails as a connection cut before the answer would: the caller
	// cannot tell that its write was stored.
	FaultAnswerLost
	// FaultSlow sends the request on after Delay.
	FaultSlow
)

func (f Fault) String() string {
	switch f {
	case FaultRefused:
		return "refused"
	case FaultTimeout:
		return "timeout"
	case FaultAnswerLost:
		return "answer-lost"
	case FaultSlow:
		return "slow"
	}
	return fmt.Sprintf("Fault(%d)", int(f))
}

// FaultRule matches API requests by method and URL path.
type FaultRule struct {
	// Method is an HTTP method ("PUT", "POST", ...); empty matches any but GET,
	// LIST and WATCH (that is, any write).
	Method string
	// Path matches the request's URL path, e.g.
	// `/apis/nv-ipam.nvidia.com/v1alpha1/namespaces/default/ippools/[^/]+/status$`.
	Path  *regexp.Regexp
	Fault Fault
	// Code is FaultRefused's HTTP status; 0 means 500.
	Code int
	// Delay is FaultTimeout's and FaultSlow's wait; 0 means 2 s.
	Delay time.Duration
	// Times is how many requests the rule takes at most; 0: every one.
	Times int
}

// Faults makes chosen API requests of a component fail, the way an overloaded
// or unreachable API server does: refused with a status, timed out, slow, or
// applied with the answer lost. Wrap a rest.Config with it; rules can be added
// and removed while the component runs.
type Faults struct {
	mu    sync.Mutex
	rules map[int]*faultRule
	next  int
	hits  map[string]int
}

type faultRule struct {
	FaultRule
	used int
}

// NewFaults returns a Faults with no rule: every request passes.
func NewFaults() *Faults {
	return &Faults{rules: map[int]*faultRule{}, hits: map[string]int{}}
}

// Add adds a rule; the returned func removes it.
func (f *Faults) Add(r FaultRule) (remove func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := f.next
	f.next++
	f.rules[id] = &faultRule{FaultRule: r}
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		delete(f.rules, id)
	}
}

// Clear removes every rule.
func (f *Faults) Clear() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.rules)
}

// Hits returns how many requests met each fault, by "fault method path".
func (f *Faults) Hits() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]int, len(f.hits))
	for k, v := range f.hits {
		out[k] = v
	}
	return out
}

// Wrap returns a copy of cfg whose requests go through f.
func (f *Faults) Wrap(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	inner := c.WrapTransport
	c.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if inner != nil {
			rt = inner(rt)
		}
		return faultTransport{f: f, next: rt}
	}
	return c
}

// match returns the rule req meets, counting it, or nil.
func (f *Faults) match(req *http.Request) *FaultRule {
	f.mu.Lock()
	defer f.mu.Unlock()
	write := req.Method != http.MethodGet && req.Method != http.MethodHead
	for id := 0; id < f.next; id++ {
		r, ok := f.rules[id]
		if !ok {
			continue
		}
		if (r.Method == "" && !write) || (r.Method != "" && r.Method != req.Method) {
			continue
		}
		if r.Path != nil && !r.Path.MatchString(req.URL.Path) {
			continue
		}
		r.used++
		if r.Times > 0 && r.used >= r.Times {
			delete(f.rules, id)
		}
		f.hits[r.Fault.String()+" "+req.Method+" "+req.URL.Path]++
		out := r.FaultRule
		return &out
	}
	return nil
}

type faultTransport struct {
	f    *Faults
	next http.RoundTripper
}

// errAnswerLost is what a request whose answer was lost fails with;
// errFaultTimeout, one that timed out.
var (
	errAnswerLost   = errors.New("connection reset by peer (fault injected: the request was applied, its answer lost)")
	errFaultTimeout = errors.New("net/http: request canceled (Client.Timeout exceeded while awaiting headers) (fault injected)")
)

func (t faultTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	r := t.f.match(req)
	if r == nil {
		return t.next.RoundTrip(req)
	}
	delay := r.Delay
	if delay == 0 {
		delay = 2 * time.Second
	}
	switch r.Fault {
	case FaultTimeout:
		select {
		case <-time.After(delay):
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
		return nil, errFaultTimeout
	case FaultSlow:
		select {
		case <-time.After(delay):
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
		return t.next.RoundTrip(req)
	case FaultAnswerLost:
		resp, err := t.next.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return nil, errAnswerLost
	}
	code := r.Code
	if code == 0 {
		code = http.StatusInternalServerError
	}
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
		_ = req.Body.Close()
	}
	reason := metav1.StatusReasonInternalError
	switch code {
	case http.StatusConflict:
		reason = metav1.StatusReasonConflict
	case http.StatusTooManyRequests:
		reason = metav1.StatusReasonTooManyRequests
	case http.StatusRequestEntityTooLarge:
		reason = metav1.StatusReasonRequestEntityTooLarge
	case http.StatusGatewayTimeout:
		reason = metav1.StatusReasonTimeout
	}
	body, _ := json.Marshal(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
		Code: int32(code), Reason: reason, Message: "fault injected: " + strconv.Itoa(code) + " for " + req.Method + " " + req.URL.Path})
	return &http.Response{StatusCode: code, Status: strconv.Itoa(code) + " " + http.StatusText(code), Proto: "HTTP/1.1",
		ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{"Content-Type": []string{"application/json"}},
		Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)), Request: req}, nil
}
