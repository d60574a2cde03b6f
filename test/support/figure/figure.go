// Package figure draws the project's plots (docs/evidence/performance.md, docs/alerts.md) with gonum's
// plot package, from the numbers of the run that measured them.
package figure

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Line is one series of a panel: a value per position of the panel's x axis (0 or NaN: none),
// or, with X, a value at each X.
type Line struct {
	Name string
	X, Y []float64
}

// Panel is one plot of a figure.
type Panel struct {
	Title, YLabel string
	Lines         []Line
	// Dots draws one point per line (its first value), instead of lines over the x axis.
	Dots bool
	// XLabel, when set, is this panel's own x axis label.
	XLabel string
}

// Write writes the panels side by side as an SVG at path (a PNG if it ends in .png): x
// positions named by xTicks (evenly spaced; none: the lines' own X), a logarithmic y axis when
// logY. No path: nothing is written.
func Write(path, xLabel string, xTicks []string, logY bool, panels ...Panel) error {
	if path == "" {
		return nil
	}
	plots := make([]*plot.Plot, len(panels))
	for i, pn := range panels {
		p := plot.New()
		p.Title.Text = pn.Title
		p.Y.Label.Text = pn.YLabel
		p.X.Label.Text = xLabel
		if pn.XLabel != "" {
			p.X.Label.Text = pn.XLabel
		}
		if logY {
			p.Y.Scale = plot.LogScale{}
			p.Y.Tick.Marker = logTicks{}
		}
		p.Add(plotter.NewGrid())
		if pn.Dots {
			if err := addDots(p, pn); err != nil {
				return err
			}
		} else if err := addLines(p, pn, xTicks); err != nil {
			return err
		}
		plots[i] = p
	}
	// At most three panels a row.
	cols := min(len(plots), 3)
	rows := (len(plots) + cols - 1) / cols
	width, height := vg.Length(cols)*5*vg.Inch, vg.Length(rows)*4*vg.Inch
	var img interface {
		vg.CanvasSizer
		io.WriterTo
	}
	if filepath.Ext(path) == ".png" {
		img = vgimg.PngCanvas{Canvas: vgimg.New(width, height)}
	} else {
		img = vgsvg.New(width, height)
	}
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: 6 * vg.Millimeter, PadY: 6 * vg.Millimeter, PadTop: 2 * vg.Millimeter,
		PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 4 * vg.Millimeter}
	grid := make([][]*plot.Plot, rows)
	for i, p := range plots {
		if grid[i/cols] == nil {
			grid[i/cols] = make([]*plot.Plot, cols)
		}
		grid[i/cols][i%cols] = p
	}
	canvases := plot.Align(grid, tiles, dc)
	for i, p := range plots {
		p.Draw(canvases[i/cols][i%cols])
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil { //nolint:gosec // G301: a docs folder, readable
		return err
	}
	f, err := os.Create(path) //nolint:gosec // G304: the path the developer asked for
	if err != nil {
		return err
	}
	if _, err := img.WriteTo(f); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote %s\n", path)
	return nil
}

func addLines(p *plot.Plot, pn Panel, xTicks []string) error {
	if len(xTicks) > 0 {
		ticks := make([]plot.Tick, len(xTicks))
		for i, l := range xTicks {
			ticks[i] = plot.Tick{Value: float64(i), Label: l}
		}
		p.X.Tick.Marker = plot.ConstantTicks(ticks)
		p.X.Min, p.X.Max = -0.25, float64(len(xTicks)-1)+0.25
	}
	p.Legend.Top, p.Legend.Left = true, true
	for k, ln := range pn.Lines {
		var pts plotter.XYs
		for i, y := range ln.Y {
			x := float64(i)
			if ln.X != nil {
				x = ln.X[i]
			}
			if !math.IsNaN(y) && (y > 0 || !isLog(p)) {
				pts = append(pts, plotter.XY{X: x, Y: y})
			}
		}
		if len(pts) == 0 {
			continue
		}
		l, s, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		l.Color, s.Color, s.Shape = plotutil.Color(k), plotutil.Color(k), plotutil.Shape(k)
		l.Dashes = plotutil.Dashes(k)
		if ln.X != nil {
			s.Radius = 0 // a time series: the line alone
		}
		p.Add(l, s)
		p.Legend.Add(ln.Name, l, s)
	}
	return nil
}

// addDots draws one point per line (its first value) over the lines' names: a bar chart that
// a logarithmic axis can hold.
func addDots(p *plot.Plot, pn Panel) error {
	names := make([]string, len(pn.Lines))
	for i, ln := range pn.Lines {
		names[i] = ln.Name
		if len(ln.Y) == 0 || ln.Y[0] <= 0 || math.IsNaN(ln.Y[0]) {
			continue
		}
		s, err := plotter.NewScatter(plotter.XYs{{X: float64(i), Y: ln.Y[0]}})
		if err != nil {
			return err
		}
		s.Color, s.Shape, s.Radius = plotutil.Color(i), plotutil.Shape(i), 4*vg.Millimeter/2
		p.Add(s)
		label, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: float64(i), Y: ln.Y[0]}}, Labels: []string{formatValue(ln.Y[0])}})
		if err != nil {
			return err
		}
		label.Offset = vg.Point{X: 3 * vg.Millimeter}
		p.Add(label)
	}
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.5, float64(len(names))-0.5
	p.X.Label.Text = ""
	return nil
}

// formatValue prints a plotted value with three significant digits.
func formatValue(v float64) string { return fmt.Sprintf("%.3g", v) }

// logTicks marks 1, 2 and 5 of every power of ten in range, all labelled.
type logTicks struct{}

func (logTicks) Ticks(minV, maxV float64) []plot.Tick {
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(minV)); e <= math.Ceil(math.Log10(maxV)); e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v >= minV && v <= maxV {
				ticks = append(ticks, plot.Tick{Value: v, Label: formatValue(v)})
			}
		}
	}
	return ticks
}

// isLog says whether p's y axis is logarithmic (where 0 has no place).
func isLog(p *plot.Plot) bool {
	_, ok := p.Y.Scale.(plot.LogScale)
	return ok
}

// Ms is a duration in milliseconds, for a plot.
func Ms(d interface{ Seconds() float64 }) float64 { return d.Seconds() * 1000 }
