package admission

import "slices"

// drr picks the tenant that gets the next free slot by deficit round robin
// (Shreedhar and Varghese): tenants with queued jobs form a ring; when the
// ring's pointer reaches a tenant, its deficit grows by its weight, and each
// job admitted costs 1. A tenant that cannot be admitted (nothing queued, or
// held by its cap, budget or a pause) is passed over and loses its deficit,
// so no tenant saves up a burst. A tenant new to the ring joins at its end,
// so it waits at most one round: the other tenants' deficits, about their
// weights.
type drr struct {
	ring    []string
	pos     int
	charged bool // the tenant at pos already got its quantum this visit
	deficit map[string]float64
}

func newDRR() *drr { return &drr{deficit: map[string]float64{}} }

// next returns the tenant to admit from, or "" when no tenant of active is
// eligible. active lists the tenants with queued jobs (any order); weight
// is a tenant's effective weight (> 0).
func (d *drr) next(active []string, eligible func(string) bool, weight func(string) float64) string {
	d.sync(active)
	if len(d.ring) == 0 {
		return ""
	}
	anyEligible := false
	for _, t := range d.ring {
		if eligible(t) {
			anyEligible = true
			break
		}
	}
	if !anyEligible {
		// Everyone is held: nobody keeps a deficit to spend later.
		clear(d.deficit)
		d.charged = false
		return ""
	}
	// Each visit of an eligible tenant adds at least MinWeight, so this
	// ends within len(ring)/MinWeight visits.
	for {
		t := d.ring[d.pos]
		if !eligible(t) {
			d.deficit[t] = 0
			d.advance()
			continue
		}
		if !d.charged {
			d.deficit[t] += max(weight(t), MinWeight)
			d.charged = true
		}
		if d.deficit[t] >= 1 {
			d.deficit[t]--
			return t
		}
		d.advance()
	}
}

func (d *drr) advance() {
	d.pos = (d.pos + 1) % len(d.ring)
	d.charged = false
}

// sync makes the ring hold exactly active: gone tenants leave (their
// deficit with them), new ones join at the end, in name order among
// themselves.
func (d *drr) sync(active []string) {
	in := make(map[string]bool, len(active))
	for _, t := range active {
		in[t] = true
	}
	cur := ""
	if len(d.ring) > 0 {
		cur = d.ring[d.pos]
	}
	kept := d.ring[:0]
	seen := map[string]bool{}
	for _, t := range d.ring {
		if in[t] {
			kept = append(kept, t)
			seen[t] = true
		} else {
			delete(d.deficit, t)
		}
	}
	var added []string
	for _, t := range active {
		if !seen[t] {
			added = append(added, t)
		}
	}
	slices.Sort(added)
	d.ring = append(kept, added...)
	if len(d.ring) == 0 {
		d.pos, d.charged = 0, false
		return
	}
	if i := slices.Index(d.ring, cur); i >= 0 {
		d.pos = i
	} else {
		d.pos, d.charged = d.pos%len(d.ring), false
	}
}
