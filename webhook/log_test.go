package webhook

import (
	"go.uber.org/zap/zapcore"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// guardLog collects the JSON log lines of every guard the tests run.
var guardLog = &testenv.Output{}

// useGuardLog sends the log of the guards the tests run to guardLog, for the tests that check
// its audit lines.
func useGuardLog() {
	ctrl.SetLogger(zap.New(zap.WriteTo(guardLog), zap.UseDevMode(false), zap.Level(zapcore.DebugLevel)))
}
