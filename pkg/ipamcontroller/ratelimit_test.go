package ipamcontroller

import (
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

func TestClientRateLimitOffUnlessSet(t *testing.T) {
	if got := withoutClientRateLimit(&rest.Config{}).QPS; got >= 0 {
		t.Errorf("QPS of a config without a limit = %v, want negative (no client-side limit)", got)
	}
	if got := withoutClientRateLimit(&rest.Config{QPS: 50, Burst: 100}); got.QPS != 50 || got.Burst != 100 {
		t.Errorf("a configured limit was changed: QPS %v burst %d", got.QPS, got.Burst)
	}
	limiter := flowcontrol.NewFakeAlwaysRateLimiter()
	if got := withoutClientRateLimit(&rest.Config{RateLimiter: limiter}); got.QPS != 0 || got.RateLimiter != limiter {
		t.Errorf("a configured rate limiter was changed: QPS %v", got.QPS)
	}
}
