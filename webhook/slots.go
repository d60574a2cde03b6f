package webhook

import (
	"context"
	"errors"
)

// errDecisionShed marks a decision that found every slot taken: it reads nothing live and the
// store decides (the fallback of a failed live read), counted as a live-read failure of kind
// shed.
var errDecisionShed = errors.New("not read live: as many decisions in flight as --max-concurrent-decisions allows")

type shedKey struct{}

// admit takes a decision slot, or marks ctx shed when none is free; release gives the slot back.
// Requests for someone other than the expected requester take their slots from a pool of
// their own (an eighth of the cap), so that they cannot crowd out the controller's decisions.
func (g *guard) admit(ctx context.Context, unexpected bool) (_ context.Context, release func()) {
	slots := g.slots
	if unexpected {
		slots = g.otherSlots
	}
	select {
	case slots <- struct{}{}:
		return ctx, func() { <-slots }
	default:
		return context.WithValue(ctx, shedKey{}, true), func() {}
	}
}

// shed says that the decision of ctx found no slot: it must not read live.
func shed(ctx context.Context) bool {
	s, _ := ctx.Value(shedKey{}).(bool)
	return s
}
