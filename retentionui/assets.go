package retentionui

import (
	"embed"
	"html/template"
	"net/http"
	"time"
)

//go:embed assets/pages.html assets/fleet.html assets/style.css
var assets embed.FS

// pages holds the templates of every page; html/template escapes what they
// show (ids, prefixes, errors) by context.
var pages = template.Must(template.New("pages").Funcs(template.FuncMap{
	"ms":   func(ms int64) string { return roundAge(time.Duration(ms) * time.Millisecond).String() },
	"msp":  func(ms *int64) string { return roundAge(time.Duration(*ms) * time.Millisecond).String() },
	"when": func(t *time.Time) string { return t.Format("2006-01-02 15:04:05.000 MST") },
	"at":   func(t time.Time) string { return t.Format("2006-01-02 15:04:05.000 MST") },
	"ago": func(now, t time.Time) string {
		return roundAge(max(now.Sub(t), 0)).String()
	},
	"lease": leaseWords,
}).ParseFS(assets, "assets/pages.html", "assets/fleet.html"))

func serveStyle(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "max-age=300")
	http.ServeFileFS(w, r, assets, "assets/style.css")
}

// leaseWords says a SweepStatus.Lease for a person.
func leaseWords(event string) string {
	switch event {
	case "acquired":
		return "held by this replica: it sweeps"
	case "held":
		return "held by another replica: this one does not sweep"
	case "lost":
		return "lost: this replica stopped sweeping"
	case "released":
		return "released: this replica does not sweep"
	}
	return "unknown: no lease event seen (no Lease, or no pass yet)"
}
