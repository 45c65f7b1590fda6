package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// The output formats --output takes.
const (
	formatText = "text"
	formatJSON = "json"
	formatYAML = "yaml"
)

// checkFormat refuses an output format the ctl does not write.
func checkFormat(f string) error {
	switch f {
	case formatText, formatJSON, formatYAML:
		return nil
	}
	return usagef("--output %q: use text, json or yaml", f)
}

// emit writes the result v of a command in the --output format: as JSON
// or YAML of v, or, for text, by calling text (nothing when it is nil).
func (o *options) emit(w io.Writer, v any, text func() error) error {
	switch o.output {
	case formatJSON:
		return writeJSON(w, v)
	case formatYAML:
		return writeYAML(w, v)
	}
	if text == nil {
		return nil
	}
	return text()
}

// structured reports whether the output is for a program (JSON or YAML):
// then stdout takes the result alone, and progress goes to stderr.
func (o *options) structured() bool { return o.output == formatJSON || o.output == formatYAML }

// writeJSON prints v as indented JSON, with the characters a terminal
// could act on escaped (see jsonSafe).
func writeJSON(w io.Writer, v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(jsonSafe(b.Bytes()))
	return err
}

// writeYAML prints v as YAML, with the same fields, names and order as
// its JSON. A string holding a character a terminal could act on is
// written double-quoted with that character as a YAML escape (\e, \x85,
// \u202e), which means the same character, so the document reads back
// to the same values.
func writeYAML(w io.Writer, v any) error {
	doc, err := json.Marshal(v)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	node, err := yamlNode(dec)
	if err != nil {
		return fmt.Errorf("yaml: %w", err)
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(node); err != nil {
		return err
	}
	if err := enc.Close(); err != nil {
		return err
	}
	_, err = w.Write(jsonSafe(b.Bytes()))
	return err
}

// yamlNode reads the next JSON value from dec as a YAML node, keeping the
// order of object fields.
func yamlNode(dec *json.Decoder) (*yaml.Node, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		n := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		if t == '{' {
			n.Kind, n.Tag = yaml.MappingNode, "!!map"
		}
		for dec.More() {
			if n.Kind == yaml.MappingNode {
				key, err := dec.Token()
				if err != nil {
					return nil, err
				}
				s, _ := key.(string)
				n.Content = append(n.Content, yamlString(s))
			}
			child, err := yamlNode(dec)
			if err != nil {
				return nil, err
			}
			n.Content = append(n.Content, child)
		}
		if _, err := dec.Token(); err != nil { // the closing delimiter
			return nil, err
		}
		if len(n.Content) == 0 {
			n.Style = yaml.FlowStyle // {} and [], not an empty node
		}
		return n, nil
	case string:
		return yamlString(t), nil
	case json.Number:
		tag := "!!int"
		if strings.ContainsAny(t.String(), ".eE") {
			tag = "!!float"
		}
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: t.String()}, nil
	case bool:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: fmt.Sprint(t)}, nil
	case nil:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}, nil
	}
	return nil, errors.New("unexpected JSON token")
}

// yamlString is a string scalar; the encoder quotes one that would read
// back as another type ("true", "3"). One with a character a terminal
// could act on is double-quoted, where jsonSafe may escape it.
func yamlString(s string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
	if strings.ContainsFunc(s, func(r rune) bool { return unsafeRune(r, false) }) {
		n.Style = yaml.DoubleQuotedStyle
	}
	return n
}
