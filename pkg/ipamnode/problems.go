package ipamnode

import "github.com/go-logr/logr"

// problems logs the problems of a loop that retries every few seconds: each
// distinct problem once, as a warning, until a success or another problem
// replaces it.
// The zero value is ready.
type problems struct {
	last string
}

// warn logs msg (with err and kv) to log unless it is the problem logged last.
func (p *problems) warn(log logr.Logger, msg string, err error, kv ...any) {
	key := msg
	if err != nil {
		key += ": " + err.Error()
		kv = append(kv, "error", err.Error())
	}
	if key == p.last {
		return
	}
	p.last = key
	log.Info("warning: "+msg, kv...)
}

// clear forgets the last problem: the next one is logged even if it is the same.
func (p *problems) clear() { p.last = "" }
