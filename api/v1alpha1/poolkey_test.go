package v1alpha1_test

import (
	"testing"

	"github.com/hwipam/hwipam/api/v1alpha1"
)

func TestSplitPoolKeyInvertsPoolKey(t *testing.T) {
	for _, c := range []struct{ kind, name, key string }{
		{v1alpha1.KindIPPool, "rail0", "rail0"},
		{v1alpha1.KindCIDRPool, "rail0", "cidrpool/rail0"},
		{v1alpha1.KindIPPool, "a.b-c", "a.b-c"},
	} {
		if got := v1alpha1.PoolKey(c.kind, c.name); got != c.key {
			t.Errorf("PoolKey(%s, %s) = %q, want %q", c.kind, c.name, got, c.key)
		}
		if kind, name := v1alpha1.SplitPoolKey(c.key); kind != c.kind || name != c.name {
			t.Errorf("SplitPoolKey(%q) = %s, %s; want %s, %s", c.key, kind, name, c.kind, c.name)
		}
	}
}
