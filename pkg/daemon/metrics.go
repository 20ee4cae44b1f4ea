package daemon

import (
	"crypto/sha256"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// MetricsOptions is the metrics endpoint of a daemon on bind ("0": none). With
// secure it is HTTPS, with a self-signed certificate the server makes at start,
// and answers only a client whose bearer token the API server authenticates
// (TokenReview) and lets get the endpoint's non-resource URL, /metrics
// (SubjectAccessReview): the daemon's service account must create both
// reviews, the scraper's may get /metrics (deploy/monitoring). Answers are
// cached for a minute per token, so that a scrape every 30 s costs the API
// server about one review of each kind a minute.
func MetricsOptions(bind string, secure bool) metricsserver.Options {
	o := metricsserver.Options{BindAddress: bind}
	if secure {
		o.SecureServing = true
		o.FilterProvider = metricsAuth
	}
	return o
}

// reviewTTL is how long an answer of the API server about a token is kept;
// maxReviews bounds how many are (scrapers are few: at the bound, all go).
const (
	reviewTTL  = time.Minute
	maxReviews = 64
)

type review struct {
	at      time.Time
	allowed bool
	status  int
}

// metricsAuth is the metrics endpoint's filter: the bearer token authenticated
// and authorized by the API server.
func metricsAuth(c *rest.Config, hc *http.Client) (metricsserver.Filter, error) {
	cs, err := kubernetes.NewForConfigAndClient(c, hc)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	cache := map[[32]byte]review{}
	decide := func(r *http.Request, token string) review {
		key := sha256.Sum256([]byte(r.URL.Path + "\x00" + token))
		mu.Lock()
		if rv, ok := cache[key]; ok && time.Since(rv.at) < reviewTTL {
			mu.Unlock()
			return rv
		}
		mu.Unlock()
		rv := review{at: time.Now(), status: http.StatusForbidden}
		tr, err := cs.AuthenticationV1().TokenReviews().Create(r.Context(),
			&authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
		switch {
		case err != nil:
			return review{status: http.StatusInternalServerError} // not cached: asked again next time
		case !tr.Status.Authenticated:
			rv.status = http.StatusUnauthorized
		default:
			u := tr.Status.User
			extra := map[string]authorizationv1.ExtraValue{}
			for k, v := range u.Extra {
				extra[k] = authorizationv1.ExtraValue(v)
			}
			sar, err := cs.AuthorizationV1().SubjectAccessReviews().Create(r.Context(), &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
					NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: r.URL.Path, Verb: "get"}}},
				metav1.CreateOptions{})
			if err != nil {
				return review{status: http.StatusInternalServerError}
			}
			rv.allowed = sar.Status.Allowed
		}
		mu.Lock()
		if len(cache) >= maxReviews {
			clear(cache)
		}
		cache[key] = rv
		mu.Unlock()
		return rv
	}
	return func(log logr.Logger, next http.Handler) (http.Handler, error) {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || token == "" {
				http.Error(w, "a bearer token is required", http.StatusUnauthorized)
				return
			}
			rv := decide(r, token)
			switch {
			case rv.allowed:
				next.ServeHTTP(w, r)
			case rv.status == http.StatusInternalServerError:
				log.Info("the API server could not review a metrics client's token; refused", "path", r.URL.Path)
				http.Error(w, "the API server could not review the token", rv.status)
			case rv.status == http.StatusUnauthorized:
				http.Error(w, "the token is not valid", rv.status)
			default:
				http.Error(w, "the token may not get "+r.URL.Path, http.StatusForbidden)
			}
		}), nil
	}, nil
}
