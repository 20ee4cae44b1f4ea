package nodeservice

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestContextErrorsKeepTheirCodes: a request that stopped waiting for a pool
// because its context ended says so, instead of looking like a daemon fault.
func TestContextErrorsKeepTheirCodes(t *testing.T) {
	for cause, want := range map[error]codes.Code{
		context.Canceled:         codes.Canceled,
		context.DeadlineExceeded: codes.DeadlineExceeded,
	} {
		err := fmt.Errorf("gave up waiting for pool rail0: %w", cause)
		if got := status.Code(toStatus(err)); got != want {
			t.Errorf("%v: code %v, want %v", err, got, want)
		}
	}
}
