package render

import (
	"fmt"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// fileLetters are git's one-letter statuses.
var fileLetters = map[string]string{
	protocol.FileAdded: "A", protocol.FileModified: "M", protocol.FileDeleted: "D",
	protocol.FileRenamed: "R", protocol.FileTypeChanged: "T",
}

// Artifact prints a workspace manifest: a summary line, then one line per
// changed file ("M src/a.go +3 −1"), then where the diff and bundle are.
func (p *Printer) Artifact(a protocol.Artifact) {
	s := fmt.Sprintf("[workspace] %s · %d files · +%d −%d · %s → %s", a.Branch, a.FilesTotal, a.Additions, a.Deletions, short(a.StartSHA), short(a.EndSHA))
	switch {
	case a.Pushed:
		s += " · pushed"
	case a.PushError != "":
		s += " · push failed: " + clip(a.PushError, 300)
	}
	if a.Checkpoint {
		s += " · as of the last checkpoint"
	}
	fmt.Fprintln(p.W, s)
	for _, f := range a.Files {
		line := fileLetters[f.Status] + " " + f.Path
		if f.OldPath != "" {
			line = fileLetters[f.Status] + " " + f.OldPath + " → " + f.Path
		}
		switch {
		case f.Binary:
			line += " (binary)"
		case f.Additions > 0 || f.Deletions > 0:
			line += fmt.Sprintf(" +%d −%d", f.Additions, f.Deletions)
		}
		fmt.Fprintln(p.W, line)
	}
	if a.Truncated {
		fmt.Fprintf(p.W, "… and %d more files\n", a.FilesTotal-len(a.Files))
	}
	fmt.Fprintf(p.W, "diff: %s (%d bytes)", a.DiffKey, a.DiffBytes)
	if a.BundleKey != "" {
		fmt.Fprintf(p.W, " · bundle: %s (%d bytes)", a.BundleKey, a.BundleBytes)
	}
	fmt.Fprintln(p.W)
}

func short(sha string) string {
	if len(sha) > 12 {
		return sha[:12]
	}
	return sha
}

// workspaceStatus is what a status line says of its workspace: the start
// commit while running, a capture or push failure at the end (the file
// list comes with the artifact).
func workspaceStatus(ws *protocol.WorkspaceStatus) string {
	switch {
	case ws == nil:
		return ""
	case ws.CaptureError != "":
		return " · workspace capture failed: " + clip(ws.CaptureError, 300)
	case ws.EndSHA == "" && ws.StartSHA != "":
		return " · checked out " + short(ws.StartSHA)
	case ws.PushError != "":
		return " · push failed (the bundle is stored)"
	case ws.Checkpoint:
		return fmt.Sprintf(" · work as of the last checkpoint: %d files +%d −%d", ws.FilesChanged, ws.Additions, ws.Deletions)
	}
	return ""
}
