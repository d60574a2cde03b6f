package main

import "testing"

// The guard holds the Go heap to 90% of the container's memory limit, unless GOMEMLIMIT says
// otherwise; a limit that is not bytes is refused.
func TestMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    int64
		set     bool
		wantErr bool
	}{
		{name: "no limit given", env: map[string]string{}},
		{name: "256 MiB", env: map[string]string{memoryLimitEnv: "268435456"}, want: 241591910, set: true},
		{name: "GOMEMLIMIT wins", env: map[string]string{memoryLimitEnv: "268435456", "GOMEMLIMIT": "100MiB"}},
		{name: "not bytes", env: map[string]string{memoryLimitEnv: "256Mi"}, wantErr: true},
		{name: "zero", env: map[string]string{memoryLimitEnv: "0"}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, set, err := memoryLimit(func(k string) string { return tc.env[k] })
			if got != tc.want || set != tc.set || (err != nil) != tc.wantErr {
				t.Errorf("memoryLimit = %d, %v, %v; want %d, %v, error %v", got, set, err, tc.want, tc.set, tc.wantErr)
			}
		})
	}
}
