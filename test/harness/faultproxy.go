package harness

import (
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// FaultProxy is an HTTPS proxy in front of the API server for components that
// run as processes: it passes every request on with the test's own credentials
// (so one identity, the test's admin, as the components' kubeconfig has), through
// Faults, so that the writes its rules choose are refused, time out, are slow, or
// are applied with their answer lost (the connection is cut before the answer).
// Watches stream through it.
type FaultProxy struct {
	srv    *httptest.Server
	Faults *Faults
}

// NewFaultProxy starts a proxy to cfg's API server on a loopback port; it is
// stopped when the test ends.
func NewFaultProxy(tb testing.TB, cfg *rest.Config, faults *Faults) *FaultProxy {
	tb.Helper()
	target, err := url.Parse(cfg.Host)
	if err != nil || target.Host == "" {
		tb.Fatalf("the API server's address %q: %v", cfg.Host, err)
	}
	base, err := rest.TransportFor(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = faultTransport{f: faults, next: base}
	rp.FlushInterval = -1
	rp.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		if errors.Is(err, errAnswerLost) || errors.Is(err, errFaultTimeout) {
			// As the network would: the connection goes, no answer comes.
			panic(http.ErrAbortHandler)
		}
		w.WriteHeader(http.StatusBadGateway)
		_, _ = fmt.Fprintf(w, "fault proxy: %v", err)
	}
	p := &FaultProxy{Faults: faults}
	p.srv = httptest.NewUnstartedServer(rp)
	p.srv.Config.ErrorLog = nil
	p.srv.StartTLS()
	tb.Cleanup(p.srv.Close)
	return p
}

// Addr is the proxy's host:port.
func (p *FaultProxy) Addr() string { return p.srv.Listener.Addr().String() }

// Config is a client configuration that reaches the API server through the
// proxy at addr (the proxy itself, or a TCP proxy in front of it).
func (p *FaultProxy) Config(addr string) *rest.Config {
	return &rest.Config{Host: "https://" + addr, TLSClientConfig: rest.TLSClientConfig{
		CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw})}}
}

// WriteKubeconfig writes a kubeconfig that reaches the API server through the
// proxy at addr and returns its path.
func (p *FaultProxy) WriteKubeconfig(dir, addr string) (string, error) {
	c := p.Config(addr)
	kc := clientcmdapi.NewConfig()
	kc.Clusters["fault-proxy"] = &clientcmdapi.Cluster{Server: c.Host, CertificateAuthorityData: c.CAData}
	kc.AuthInfos["through-proxy"] = &clientcmdapi.AuthInfo{}
	kc.Contexts["fault-proxy"] = &clientcmdapi.Context{Cluster: "fault-proxy", AuthInfo: "through-proxy"}
	kc.CurrentContext = "fault-proxy"
	raw, err := clientcmd.Write(*kc)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "kubeconfig-faults")
	return path, os.WriteFile(path, raw, 0o600)
}
