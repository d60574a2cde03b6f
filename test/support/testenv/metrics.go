package testenv

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"
)

// APIServerCounter sums the series of the API server's counter name whose labels include
// labels, read from its /metrics endpoint: what the API server itself counts, e.g.
// apiserver_admission_webhook_request_total by webhook name.
func (e *Env) APIServerCounter(ctx context.Context, name string, labels map[string]string) (float64, error) {
	mfs, err := e.APIServerMetrics(ctx)
	if err != nil {
		return 0, err
	}
	return SumSeries(mfs, name, labels), nil
}

// SumSeries sums the series of the counter or gauge (or the counts of the histogram) name that
// carry every label of labels with its value.
func SumSeries(mfs map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	var sum float64
	for _, m := range mfs[name].GetMetric() {
		if !hasLabels(m, labels) {
			continue
		}
		switch {
		case m.GetHistogram() != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		default:
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// WebhookCalls returns a function that reads how many times the API server has called the
// webhook named name (apiserver_admission_webhook_request_total), failing t on an error.
func (e *Env) WebhookCalls(t testing.TB, name string) func() float64 {
	return func() float64 {
		t.Helper()
		n, err := e.APIServerCounter(t.Context(), "apiserver_admission_webhook_request_total", map[string]string{"name": name})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
}

// APIServerMetrics reads and parses the API server's /metrics.
func (e *Env) APIServerMetrics(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		return nil, err
	}
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's metrics: %w", err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("parsing the API server's metrics: %w", err)
	}
	return mfs, nil
}

// Metrics reads and parses the guard's metrics endpoint (plain HTTP).
func (g *Guard) Metrics(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.MetricsAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// HistogramQuantileBetween is the upper bound of the bucket of the histogram name (its series
// that carry labels, summed) that holds the q quantile of the observations made between the
// scrapes before and after: the quantile, to the resolution of the buckets. It is +Inf when the
// quantile lies past the last bound, and 0 when nothing was observed.
func HistogramQuantileBetween(before, after map[string]*dto.MetricFamily, name string, labels map[string]string, q float64) float64 {
	counts := func(mfs map[string]*dto.MetricFamily) (map[float64]uint64, uint64) {
		cum := map[float64]uint64{}
		var total uint64
		for _, m := range mfs[name].GetMetric() {
			if !hasLabels(m, labels) || m.GetHistogram() == nil {
				continue
			}
			total += m.GetHistogram().GetSampleCount()
			for _, b := range m.GetHistogram().GetBucket() {
				cum[b.GetUpperBound()] += b.GetCumulativeCount()
			}
		}
		return cum, total
	}
	b, bt := counts(before)
	a, at := counts(after)
	total := at - bt
	if total == 0 {
		return 0
	}
	bounds := make([]float64, 0, len(a))
	for ub := range a {
		bounds = append(bounds, ub)
	}
	slices.Sort(bounds)
	rank := uint64(math.Ceil(q * float64(total)))
	for _, ub := range bounds {
		if a[ub]-b[ub] >= rank {
			return ub
		}
	}
	return math.Inf(1)
}

// hasLabels says whether m carries every label of labels.
func hasLabels(m *dto.Metric, labels map[string]string) bool {
	matched := 0
	for _, lp := range m.GetLabel() {
		if v, ok := labels[lp.GetName()]; ok && v == lp.GetValue() {
			matched++
		}
	}
	return matched == len(labels)
}

// HistogramMeanBetween is the mean of the observations of the histogram name (its series that
// carry labels) made between the scrapes before and after; 0 when there were none.
func HistogramMeanBetween(before, after map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	sums := func(mfs map[string]*dto.MetricFamily) (sum float64, count uint64) {
		for _, m := range mfs[name].GetMetric() {
			if h := m.GetHistogram(); h != nil && hasLabels(m, labels) {
				sum, count = sum+h.GetSampleSum(), count+h.GetSampleCount()
			}
		}
		return sum, count
	}
	bs, bc := sums(before)
	as, ac := sums(after)
	if ac == bc {
		return 0
	}
	return (as - bs) / float64(ac-bc)
}
