package agent

import (
	"strconv"
	"strings"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// BaseArgs are the flags every run gets: print mode, stream-json output,
// and --verbose, which stream-json requires.
var BaseArgs = []string{"-p", "--output-format", "stream-json", "--verbose"}

// BuildArgv returns the agent's argv: command (program and fixed leading
// args), BaseArgs, then one flag per option set in opts. The prompt is never
// part of argv: it goes on stdin, so no prompt text can become a flag. Values
// are argv elements (never shell-joined). Free-text values (system prompts)
// and --resume use the equals form, so a value starting with "-" can never be
// parsed as a flag; the other values are validated patterns that cannot
// start with "-".
func BuildArgv(command []string, opts protocol.Options) []string {
	argv := make([]string, 0, len(command)+len(BaseArgs)+16)
	argv = append(argv, command...)
	argv = append(argv, BaseArgs...)
	if opts.Model != "" {
		argv = append(argv, "--model", opts.Model)
	}
	if opts.MaxTurns != nil {
		argv = append(argv, "--max-turns", strconv.Itoa(*opts.MaxTurns))
	}
	if opts.MaxBudgetUSD != nil {
		argv = append(argv, "--max-budget-usd", strconv.FormatFloat(*opts.MaxBudgetUSD, 'f', -1, 64))
	}
	if opts.PermissionMode != "" {
		argv = append(argv, "--permission-mode", opts.PermissionMode)
	}
	if len(opts.AllowedTools) > 0 {
		argv = append(argv, "--allowedTools", strings.Join(opts.AllowedTools, ","))
	}
	if len(opts.DisallowedTools) > 0 {
		argv = append(argv, "--disallowedTools", strings.Join(opts.DisallowedTools, ","))
	}
	if opts.SystemPrompt != nil {
		argv = append(argv, "--system-prompt="+*opts.SystemPrompt)
	}
	if opts.AppendSystemPrompt != nil {
		argv = append(argv, "--append-system-prompt="+*opts.AppendSystemPrompt)
	}
	if opts.Resume != "" {
		argv = append(argv, "--resume="+opts.Resume)
	}
	return argv
}
