// Package buildinfo says which build of agentfleet is running: the version
// set at link time (-ldflags "-X github.com/agentfleet/agentfleet/internal/buildinfo.version=v1.2.3"),
// else the module version, plus the VCS revision Go records in the binary.
package buildinfo

import (
	"regexp"
	"runtime/debug"
	"strings"
)

// version is set with -ldflags -X at release builds.
var version = ""

// Info describes the running build.
type Info struct {
	Version   string `json:"version"`
	Revision  string `json:"revision,omitempty"`
	Modified  bool   `json:"modified,omitempty"`
	GoVersion string `json:"go_version"`
}

// Get returns the running build's Info.
func Get() Info {
	info := Info{Version: version}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		if info.Version == "" {
			info.Version = "devel"
		}
		return info
	}
	info.GoVersion = bi.GoVersion
	if info.Version == "" {
		info.Version = bi.Main.Version
	}
	if info.Version == "" || info.Version == "(devel)" {
		info.Version = "devel"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

// Version is a one-word version: Version, plus the short revision for
// development builds ("devel+1a2b3c4d", "+dirty" when modified).
func Version() string {
	i := Get()
	v := i.Version
	if v == "devel" && i.Revision != "" {
		v += "+" + i.Revision[:min(len(i.Revision), 12)]
		if i.Modified {
			v += "-dirty"
		}
	}
	return strings.TrimSpace(v)
}

// SemVer is Version as semantic versioning (NATS micro requires it):
// a release tag without its "v", else 0.0.0-devel.
func SemVer() string {
	v := strings.TrimPrefix(Get().Version, "v")
	if semver.MatchString(v) {
		return v
	}
	return "0.0.0-devel"
}

var semver = regexp.MustCompile(`^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)
