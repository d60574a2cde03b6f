package testenv

import (
	"testing"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/utils/ptr"
)

// SumSeries reads gauges as well as counters and histograms, and a series must carry every
// label asked for: a series without it is not a match.
func TestSumSeriesReadsEveryKindAndMatchesEveryLabel(t *testing.T) {
	label := func(pairs ...string) []*dto.LabelPair {
		var out []*dto.LabelPair
		for i := 0; i < len(pairs); i += 2 {
			out = append(out, &dto.LabelPair{Name: ptr.To(pairs[i]), Value: ptr.To(pairs[i+1])})
		}
		return out
	}
	mfs := map[string]*dto.MetricFamily{
		"stuck": {Metric: []*dto.Metric{
			{Label: label("cause", "free"), Gauge: &dto.Gauge{Value: ptr.To(2.0)}},
			{Label: label("cause", "held"), Gauge: &dto.Gauge{Value: ptr.To(1.0)}},
			{Gauge: &dto.Gauge{Value: ptr.To(7.0)}}, // no cause label
		}},
		"decisions": {Metric: []*dto.Metric{
			{Label: label("verdict", "denied", "kind", "Pod"), Counter: &dto.Counter{Value: ptr.To(3.0)}},
			{Label: label("verdict", "allowed", "kind", "Pod"), Counter: &dto.Counter{Value: ptr.To(5.0)}},
		}},
		"latency": {Metric: []*dto.Metric{
			{Label: label("result", "found"), Histogram: &dto.Histogram{SampleCount: ptr.To[uint64](4)}},
		}},
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"stuck", map[string]string{"cause": "free"}, 2},
		{"stuck", map[string]string{"cause": "held"}, 1},
		{"stuck", nil, 10},
		{"decisions", map[string]string{"verdict": "denied"}, 3},
		{"decisions", map[string]string{"kind": "Pod"}, 8},
		{"decisions", map[string]string{"verdict": "denied", "reason": "x"}, 0},
		{"latency", map[string]string{"result": "found"}, 4},
		{"missing", nil, 0},
	} {
		if got := SumSeries(mfs, c.name, c.labels); got != c.want {
			t.Errorf("SumSeries(%s, %v) = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}
