package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// The version, commit and build date, set by the build (make build, the image, the release):
// go build -ldflags "-X main.version=0.1.0 -X main.commit=<sha> -X main.date=<RFC 3339>".
var (
	version string
	commit  string
	date    string
)

// buildVersion is this binary's version, commit and build date: those the build set, else what
// the Go toolchain recorded (the module's version when built with go install; the VCS revision
// and commit time of a build from a checkout, "-dirty" when it had changes).
func buildVersion() (v, c, d string) {
	v, c, d = version, commit, date
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return orUnknown(v), orUnknown(c), orUnknown(d)
	}
	if v == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
		v = info.Main.Version
	}
	var dirty bool
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			if c == "" {
				c = s.Value
			}
		case "vcs.time":
			if d == "" {
				d = s.Value
			}
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && commit == "" && c != "" {
		c += "-dirty"
	}
	return orUnknown(v), orUnknown(c), orUnknown(d)
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// versionLine is what --version prints.
func versionLine() string {
	v, c, d := buildVersion()
	return fmt.Sprintf("exit-guard %s (commit %s, built %s, %s %s/%s)", v, c, d, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
