package main

import (
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"
)

const (
	// memoryLimitEnv carries the container's memory limit in bytes (the chart sets it from
	// the downward API, resourceFieldRef limits.memory).
	memoryLimitEnv = "EXIT_GUARD_MEMORY_LIMIT"
	// memoryLimitShare is the part of the container's limit the Go heap is held to: the rest
	// is room for what the Go runtime does not count (stacks in use, the binary, cgo-free
	// but not free of the kernel's page cache) before the kernel's OOM killer acts.
	memoryLimitShare = 0.9
)

// memoryLimit returns the Go memory limit to set from the environment: none when GOMEMLIMIT
// is set (the runtime has read it) or no container limit is given; 90% of the container's
// limit otherwise. A limit that is not a positive number of bytes is an error.
func memoryLimit(getenv func(string) string) (int64, bool, error) {
	if getenv("GOMEMLIMIT") != "" {
		return 0, false, nil
	}
	raw := getenv(memoryLimitEnv)
	if raw == "" {
		return 0, false, nil
	}
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || n <= 0 {
		return 0, false, fmt.Errorf("%s=%q: want the container's memory limit in bytes", memoryLimitEnv, raw)
	}
	return int64(math.Floor(float64(n) * memoryLimitShare)), true, nil
}

// setMemoryLimit applies memoryLimit to the Go runtime and says what it set.
func setMemoryLimit() (int64, bool, error) {
	limit, ok, err := memoryLimit(os.Getenv)
	if ok {
		debug.SetMemoryLimit(limit)
	}
	return limit, ok, err
}
