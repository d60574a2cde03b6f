package webhook

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// gathered is the sum of the series of name in g that carry labels (histograms: their counts).
func gathered(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	mfs := map[string]*dto.MetricFamily{}
	for _, mf := range families {
		mfs[mf.GetName()] = mf
	}
	return testenv.SumSeries(mfs, name, labels)
}
