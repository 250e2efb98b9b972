package main

import (
	"context"
	"fmt"
	"time"

	"github.com/remediate-dev/remediate/internal/kube"
)

// apiProbeTimeout bounds the start-up question "does the API server
// answer?". Without an answer the daemon says so in one line and does not
// wait for the cluster view (client-go keeps retrying in the background,
// its errors logged at debug level).
const apiProbeTimeout = 5 * time.Second

// probeAPIServer asks the API server for /version within apiProbeTimeout.
func probeAPIServer(ctx context.Context, c *kube.Client) error {
	pctx, cancel := context.WithTimeout(ctx, apiProbeTimeout)
	defer cancel()
	start := time.Now()
	if _, err := c.Interface.Discovery().RESTClient().Get().AbsPath("/version").DoRaw(pctx); err != nil {
		if pctx.Err() != nil {
			return fmt.Errorf("no answer within %s from %s", apiProbeTimeout, c.Config.Host)
		}
		return fmt.Errorf("%s did not answer (after %s): %w", c.Config.Host, time.Since(start).Round(time.Millisecond), err)
	}
	return nil
}
