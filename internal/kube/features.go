package kube

import (
	"os"
	"sync"

	clientfeatures "k8s.io/client-go/features"
)

// watchListEnv is the environment variable client-go reads for its
// WatchListClient gate; set (to true or false) it wins over the default here.
const watchListEnv = "KUBE_FEATURE_WatchListClient"

var streamingOnce sync.Once

// EnableStreamingList turns client-go's WatchListClient gate on by default
// (client-go v0.34 ships it off): the informers' initial list is then
// streamed over the watch and each object compacted as it arrives, instead
// of decoding one list of every Service or EndpointSlice first (about
// 10 MiB less steady RSS and a much lower peak at 10,000 Services,
// internal/kube/e2e BenchmarkViewSteadyState). client-go falls back to
// LIST where the apiserver cannot stream. KUBE_FEATURE_WatchListClient,
// when set, still decides. The gate is client-go's, process-wide: the
// daemon calls this once before its first informer is built (client-go's
// fake clientset cannot stream, so a library that may share a process with
// fakes does not).
func EnableStreamingList() {
	streamingOnce.Do(func() { setStreamingList() })
}

// setStreamingList replaces the gates and returns the previous ones.
func setStreamingList() (prev clientfeatures.Gates) {
	prev = clientfeatures.FeatureGates()
	if _, set := os.LookupEnv(watchListEnv); !set {
		clientfeatures.ReplaceFeatureGates(watchListOn{prev})
	}
	return prev
}

// watchListOn answers true for WatchListClient and defers every other
// gate to client-go's own.
type watchListOn struct{ clientfeatures.Gates }

func (g watchListOn) Enabled(f clientfeatures.Feature) bool {
	if f == clientfeatures.WatchListClient {
		return true
	}
	return g.Gates.Enabled(f)
}

// StreamingListEnabled reports whether client-go streams initial lists.
func StreamingListEnabled() bool {
	return clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient)
}
