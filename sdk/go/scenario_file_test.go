package casq_test

// Scenario files (test/scenarios/*.json) for the Go runner: their types, and
// loading, which validates each file against
// test/scenarios/scenario.schema.json and then checks what a schema cannot
// say (fields that depend on one another).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// repoRoot is the repository's root directory.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func scenarioDir() string { return filepath.Join(repoRoot(), "test", "scenarios") }

func schemaPath() string { return filepath.Join(scenarioDir(), "scenario.schema.json") }

// scenarioFiles lists every *.json of test/scenarios but the schema, sorted.
func scenarioFiles(t *testing.T) []string {
	files, err := filepath.Glob(filepath.Join(scenarioDir(), "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	files = slices.DeleteFunc(files, func(f string) bool { return strings.HasSuffix(f, ".schema.json") })
	if len(files) == 0 {
		t.Fatal("no scenarios in test/scenarios")
	}
	return files
}

// schemaJSON is the schema document, read once (numbers as json.Number).
var schemaJSON = sync.OnceValues(func() (map[string]any, error) {
	f, err := os.Open(schemaPath())
	if err != nil {
		return nil, err
	}
	defer f.Close()
	doc, err := jsonschema.UnmarshalJSON(f)
	if err != nil {
		return nil, err
	}
	m, ok := doc.(map[string]any)
	if !ok {
		return nil, errors.New("not an object")
	}
	return m, nil
})

// scenarioSchema is the compiled schema, compiled once.
var scenarioSchema = sync.OnceValues(func() (*jsonschema.Schema, error) {
	doc, err := schemaJSON()
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource(schemaPath(), doc); err != nil {
		return nil, err
	}
	return c.Compile(schemaPath())
})

// --- types: the schema's shapes, decoded once the schema's defaults are
// filled in (a pointer is an optional field without a default) ---

type scenarioFile struct {
	Schema        string            `json:"$schema"`
	Name          string            `json:"name"`
	Description   string            `json:"description"`
	Brokers       int               `json:"brokers"`
	Queue         scenarioQueue     `json:"queue"`
	Subscriptions []string          `json:"subscriptions"`
	Steps         []json.RawMessage `json:"steps"`
}

type scenarioQueue struct {
	Shards      uint32  `json:"shards"`
	LeaseTTLMs  int64   `json:"leaseTtlMs"`
	MaxAttempts *uint32 `json:"maxAttempts"`
	BackoffMs   int64   `json:"backoffMs"`
}

type scenarioMessage struct {
	Payload     string            `json:"payload"`
	Key         string            `json:"key"`
	Priority    int32             `json:"priority"`
	DelayMs     int64             `json:"delayMs"`
	MaxAttempts uint32            `json:"maxAttempts"`
	DedupID     string            `json:"dedupId"`
	Headers     map[string]string `json:"headers"`
}

type enqueueStep struct {
	Batch           bool              `json:"batch"`
	Via             *int              `json:"via"`
	Messages        []scenarioMessage `json:"messages"`
	ExpectDuplicate []bool            `json:"expectDuplicate"`
}

type produceStep struct {
	Count           int    `json:"count"`
	Prefix          string `json:"prefix"`
	KillLeaderAfter int    `json:"killLeaderAfter"`
}

// brokerStep is restartBroker, freezeBroker or thawBroker.
type brokerStep struct {
	Do     string `json:"do"`
	Broker int    `json:"broker"`
}

type awaitLeaseLapseStep struct {
	Broker    int   `json:"broker"`
	TimeoutMs int64 `json:"timeoutMs"`
}

type expectLeadersStep struct {
	Distinct int `json:"distinct"`
}

type startWorkerStep struct {
	Name         string `json:"name"`
	Subscription string `json:"subscription"`
	Concurrency  int    `json:"concurrency"`
	Prefetch     int    `json:"prefetch"`
	Handler      string `json:"handler"`
	HandlerMs    int64  `json:"handlerMs"`
	LeaseTTLMs   int64  `json:"leaseTtlMs"`
}

type awaitWorkerStep struct {
	Name             string   `json:"name"`
	Started          *int     `json:"started"`
	Completed        *int     `json:"completed"`
	DistinctPayloads *int     `json:"distinctPayloads"`
	TimeoutMs        int64    `json:"timeoutMs"`
	Expect           []string `json:"expect"`
	Ordered          bool     `json:"ordered"`
	ExpectAttempts   []uint32 `json:"expectAttempts"`
	ExpectAllOf      *struct {
		Prefix string `json:"prefix"`
		Count  int    `json:"count"`
	} `json:"expectAllOf"`
}

type stopWorkerStep struct {
	Name            string `json:"name"`
	TimeoutMs       int64  `json:"timeoutMs"`
	ExpectStarted   *int   `json:"expectStarted"`
	ExpectCompleted *int   `json:"expectCompleted"`
}

type crashWorkerStep struct {
	Subscription string   `json:"subscription"`
	Jobs         int      `json:"jobs"`
	Expect       []string `json:"expect"`
	TimeoutMs    int64    `json:"timeoutMs"`
}

type statsStep struct {
	Subscription string            `json:"subscription"`
	Expect       map[string]uint64 `json:"expect"`
	Counters     map[string]uint64 `json:"counters"`
	TimeoutMs    int64             `json:"timeoutMs"`
}

type deadLettersStep struct {
	Subscription string   `json:"subscription"`
	Expect       []string `json:"expect"`
}

type redriveStep struct {
	Subscription string `json:"subscription"`
	Expect       uint64 `json:"expect"`
}

// --- step kinds ---

// parsedStep is one decoded step: its kind, its typed value and how to run it.
type parsedStep struct {
	do    string
	value any
	run   func(ctx context.Context, r *scenarioRun) error
}

// stepKind decodes a validated step of one kind into its type.
type stepKind struct {
	decode func(do string, raw json.RawMessage) (parsedStep, error)
	typ    reflect.Type // for TestScenarioTypesMatchSchema
}

// kindOf is the stepKind whose steps decode into T and run with method run.
func kindOf[T any](run func(*scenarioRun, context.Context, *T) error) stepKind {
	return stepKind{
		decode: func(do string, raw json.RawMessage) (parsedStep, error) {
			s := new(T)
			if err := json.Unmarshal(raw, s); err != nil {
				return parsedStep{}, err
			}
			return parsedStep{do, s, func(ctx context.Context, r *scenarioRun) error { return run(r, ctx, s) }}, nil
		},
		typ: reflect.TypeFor[T](),
	}
}

// stepKinds is every step kind this runner implements; TestScenarioStepKinds
// checks that its keys are the schema's step kinds.
var stepKinds = map[string]stepKind{
	"enqueue":         kindOf((*scenarioRun).enqueue),
	"produce":         kindOf((*scenarioRun).produce),
	"restartBroker":   kindOf((*scenarioRun).restartBroker),
	"freezeBroker":    kindOf((*scenarioRun).freezeBroker),
	"thawBroker":      kindOf((*scenarioRun).freezeBroker),
	"awaitLeaseLapse": kindOf((*scenarioRun).awaitLeaseLapse),
	"expectLeaders":   kindOf((*scenarioRun).expectLeaders),
	"startWorker":     kindOf((*scenarioRun).startWorker),
	"awaitWorker":     kindOf((*scenarioRun).awaitWorker),
	"stopWorker":      kindOf((*scenarioRun).stopWorker),
	"crashWorker":     kindOf((*scenarioRun).crashWorker),
	"stats":           kindOf((*scenarioRun).stats),
	"deadLetters":     kindOf((*scenarioRun).deadLetters),
	"redrive":         kindOf((*scenarioRun).redrive),
}

// --- loading ---

// schemaProblems lists the schema's complaints about doc (the leaves of the
// error tree), one line each, placed as "step 2 (enqueue) messages/0"
// rather than "/steps/2/messages/0".
func schemaProblems(doc any, err error) string {
	var verr *jsonschema.ValidationError
	if !errors.As(err, &verr) {
		return err.Error()
	}
	steps, _ := doc.(map[string]any)["steps"].([]any)
	english := message.NewPrinter(language.English)
	var lines []string
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) > 0 {
			for _, c := range e.Causes {
				walk(c)
			}
			return
		}
		where := "top level"
		if loc := e.InstanceLocation; len(loc) >= 2 && loc[0] == "steps" {
			kind := "?"
			if i, err := strconv.Atoi(loc[1]); err == nil && i < len(steps) {
				if do, ok := steps[i].(map[string]any)["do"].(string); ok {
					kind = do
				}
			}
			where = fmt.Sprintf("step %s (%s)", loc[1], kind)
			if len(loc) > 2 {
				where += " " + strings.Join(loc[2:], "/")
			}
		} else if len(loc) > 0 {
			where = strings.Join(loc, "/")
		}
		lines = append(lines, fmt.Sprintf("%s: %s", where, e.ErrorKind.LocalizedString(english)))
	}
	walk(verr)
	return strings.Join(lines, "\n  ")
}

// parseScenario validates data against the schema, decodes it, and checks
// what the schema cannot: a scenario this runner does not fully understand
// fails before anything runs.
func parseScenario(data []byte, label string) (*scenarioFile, []parsedStep, error) {
	schema, err := scenarioSchema()
	if err != nil {
		return nil, nil, fmt.Errorf("schema %s: %w", schemaPath(), err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", label, err)
	}
	if err := schema.Validate(doc); err != nil {
		return nil, nil, fmt.Errorf("%s: not a valid scenario (%s):\n  %s", label, schemaPath(), schemaProblems(doc, err))
	}
	root, _ := schemaJSON() // read without error by scenarioSchema
	if err := fillDefaults(root, root, doc); err != nil {
		return nil, nil, fmt.Errorf("schema %s: %w", schemaPath(), err)
	}
	filled, err := json.Marshal(doc)
	if err != nil {
		return nil, nil, err
	}
	var sc scenarioFile
	if err := json.Unmarshal(filled, &sc); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", label, err)
	}
	steps := make([]parsedStep, len(sc.Steps))
	for i, raw := range sc.Steps {
		var head struct {
			Do string `json:"do"`
		}
		_ = json.Unmarshal(raw, &head) // valid: the schema checked it
		kind, ok := stepKinds[head.Do]
		if !ok {
			return nil, nil, fmt.Errorf("%s: step %d (%s): the schema allows it but this runner does not implement it", label, i, head.Do)
		}
		if steps[i], err = kind.decode(head.Do, raw); err != nil {
			return nil, nil, fmt.Errorf("%s: step %d (%s): %w", label, i, head.Do, err)
		}
		if err := checkStep(steps[i].value, sc.Brokers); err != nil {
			return nil, nil, fmt.Errorf("%s: step %d (%s): %w", label, i, head.Do, err)
		}
	}
	return &sc, steps, nil
}

// fillDefaults sets every absent property of instance that has a "default"
// in schema, and recurses into the values present, following local $refs,
// allOf, items, and the if/then pairs of the step kinds (an "if" that
// only compares properties with "const"). It is ajv's useDefaults rule, so
// the three runners take the same defaults from the schema.
func fillDefaults(root, schema map[string]any, instance any) error {
	if ref, ok := schema["$ref"].(string); ok {
		target, err := resolveRef(root, ref)
		if err != nil {
			return err
		}
		if err := fillDefaults(root, target, instance); err != nil {
			return err
		}
	}
	for _, sub := range asSlice(schema["allOf"]) {
		if err := fillDefaults(root, sub.(map[string]any), instance); err != nil {
			return err
		}
	}
	if cond, ok := schema["if"].(map[string]any); ok {
		matches, err := constsMatch(cond, instance)
		if err != nil {
			return err
		}
		if then, ok := schema["then"].(map[string]any); ok && matches {
			if err := fillDefaults(root, then, instance); err != nil {
				return err
			}
		}
	}
	switch v := instance.(type) {
	case map[string]any:
		props, _ := schema["properties"].(map[string]any)
		for name, p := range props {
			prop := p.(map[string]any)
			if def, ok := prop["default"]; ok {
				if _, present := v[name]; !present {
					v[name] = deepCopy(def)
				}
			}
			if value, present := v[name]; present {
				if err := fillDefaults(root, prop, value); err != nil {
					return err
				}
			}
		}
	case []any:
		if items, ok := schema["items"].(map[string]any); ok {
			for _, item := range v {
				if err := fillDefaults(root, items, item); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// constsMatch evaluates an "if" made only of properties compared with const.
func constsMatch(cond map[string]any, instance any) (bool, error) {
	obj, _ := instance.(map[string]any)
	for key, value := range cond {
		if key != "properties" {
			return false, fmt.Errorf("fillDefaults understands only an \"if\" of properties with const, not %q", key)
		}
		for name, p := range value.(map[string]any) {
			want, ok := p.(map[string]any)["const"]
			if !ok || len(p.(map[string]any)) != 1 {
				return false, fmt.Errorf("fillDefaults understands only an \"if\" of properties with const, not %v", p)
			}
			if got, present := obj[name]; present && got != want {
				return false, nil
			}
		}
	}
	return true, nil
}

func resolveRef(root map[string]any, ref string) (map[string]any, error) {
	name, ok := strings.CutPrefix(ref, "#/$defs/")
	if !ok {
		return nil, fmt.Errorf("fillDefaults follows only #/$defs/ references, not %q", ref)
	}
	target, ok := lookup(root, "$defs", name).(map[string]any)
	if !ok {
		return nil, fmt.Errorf("no $defs/%s", name)
	}
	return target, nil
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

// deepCopy copies a default taken from the schema, so that no two scenarios share one value.
func deepCopy(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			out[k] = deepCopy(x)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = deepCopy(x)
		}
		return out
	}
	return v
}

// checkStep makes the checks that relate several fields, which the schema
// cannot express.
func checkStep(step any, brokers int) error {
	index := -1
	switch s := step.(type) {
	case *brokerStep:
		index = s.Broker
	case *awaitLeaseLapseStep:
		index = s.Broker
	case *enqueueStep:
		if s.Via != nil {
			index = *s.Via
		}
		if s.ExpectDuplicate != nil && len(s.ExpectDuplicate) != len(s.Messages) {
			return fmt.Errorf("expectDuplicate needs one entry per message")
		}
	case *produceStep:
		if s.KillLeaderAfter > s.Count {
			return fmt.Errorf("killLeaderAfter %d is above count %d", s.KillLeaderAfter, s.Count)
		}
	}
	if index >= brokers {
		return fmt.Errorf("broker index %d is not one of the %d brokers", index, brokers)
	}
	return nil
}

// --- tests of the loader ---

func TestScenarioFilesValidate(t *testing.T) {
	for _, f := range scenarioFiles(t) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := parseScenario(data, filepath.Base(f)); err != nil {
			t.Error(err)
		}
	}
}

// schemaDoc is the schema as plain JSON, for the drift tests.
func schemaDoc(t *testing.T) map[string]any {
	doc, err := schemaJSON()
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

func lookup(doc any, path ...string) any {
	for _, p := range path {
		doc = doc.(map[string]any)[p]
	}
	return doc
}

func TestScenarioStepKindsMatchSchema(t *testing.T) {
	var schemaKinds []string
	for _, k := range lookup(schemaDoc(t), "$defs", "step", "properties", "do", "enum").([]any) {
		schemaKinds = append(schemaKinds, k.(string))
	}
	slices.Sort(schemaKinds)
	var implemented []string
	for k := range stepKinds {
		implemented = append(implemented, k)
	}
	slices.Sort(implemented)
	if !slices.Equal(schemaKinds, implemented) {
		t.Errorf("the schema's step kinds %q differ from the ones this runner implements %q", schemaKinds, implemented)
	}
}

// json.Unmarshal ignores a field its struct lacks: each struct must name
// exactly the properties the schema allows, or a runner would skip a field
// it does not understand.
func TestScenarioTypesMatchSchema(t *testing.T) {
	doc := schemaDoc(t)
	// propertyNames are the sorted names of a schema node's properties, "do" left out.
	propertyNames := func(path ...string) []string {
		var names []string
		for name := range lookup(doc, append(path, "properties")...).(map[string]any) {
			if name != "do" {
				names = append(names, name)
			}
		}
		slices.Sort(names)
		return names
	}
	// jsonNames are the sorted json names a struct type decodes, "do" left out.
	jsonNames := func(typ reflect.Type) []string {
		var names []string
		for i := range typ.NumField() {
			if name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ","); name != "do" {
				names = append(names, name)
			}
		}
		slices.Sort(names)
		return names
	}
	type checked struct {
		path []string // of the schema node
		typ  reflect.Type
	}
	all := []checked{
		{nil, reflect.TypeFor[scenarioFile]()},
		{[]string{"properties", "queue"}, reflect.TypeFor[scenarioQueue]()},
		{[]string{"$defs", "message"}, reflect.TypeFor[scenarioMessage]()},
	}
	for kind, k := range stepKinds {
		all = append(all, checked{[]string{"$defs", kind}, k.typ})
	}
	for _, c := range all {
		if inSchema, inType := propertyNames(c.path...), jsonNames(c.typ); !slices.Equal(inSchema, inType) {
			t.Errorf("schema /%s allows %q, the Go type %s decodes %q", strings.Join(c.path, "/"), inSchema, c.typ, inType)
		}
	}
}

// The stats step names fields of two proto messages: the schema must list
// exactly their uint64 fields (camelCase JSON names).
func TestScenarioStatsFieldsMatchProto(t *testing.T) {
	doc := schemaDoc(t)
	for def, msg := range map[string]protoreflect.Message{
		"subscriptionStats":    (&casqv1.SubscriptionStats{}).ProtoReflect(),
		"subscriptionCounters": (&casqv1.SubscriptionCounters{}).ProtoReflect(),
	} {
		var inSchema, inProto []string
		for name := range lookup(doc, "$defs", def, "properties").(map[string]any) {
			inSchema = append(inSchema, name)
		}
		fields := msg.Descriptor().Fields()
		for i := range fields.Len() {
			if f := fields.Get(i); f.Kind() == protoreflect.Uint64Kind {
				inProto = append(inProto, f.JSONName())
			}
		}
		slices.Sort(inSchema)
		slices.Sort(inProto)
		if !slices.Equal(inSchema, inProto) {
			t.Errorf("schema $defs/%s lists %q, the proto's uint64 fields are %q", def, inSchema, inProto)
		}
	}
}

// loaderCases are the cases all three runners' loaders share.
type loaderCases struct {
	Refused []struct {
		Why      string          `json:"why"`
		Scenario json.RawMessage `json:"scenario"`
		Mentions []string        `json:"mentions"`
	} `json:"refused"`
	Accepted []struct {
		Why      string          `json:"why"`
		Scenario json.RawMessage `json:"scenario"`
	} `json:"accepted"`
}

func TestScenarioLoaderCases(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(scenarioDir(), "loader-cases", "cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases loaderCases
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases.Refused {
		_, _, err := parseScenario(c.Scenario, "bad.json")
		if err == nil {
			t.Errorf("refuses %s: accepted %s", c.Why, c.Scenario)
			continue
		}
		for _, m := range c.Mentions {
			if !strings.HasPrefix(err.Error(), "bad.json: ") || !strings.Contains(err.Error(), m) {
				t.Errorf("refuses %s: error %q does not say %q", c.Why, err, m)
			}
		}
	}
	for _, c := range cases.Accepted {
		if _, _, err := parseScenario(c.Scenario, "ok.json"); err != nil {
			t.Errorf("accepts %s: %v", c.Why, err)
		}
	}
}

func TestScenarioLoaderListsEveryProblem(t *testing.T) {
	_, _, err := parseScenario([]byte(`{"name": "x", "extra": 1, "steps": [{"do": "restartBroker"}, {"do": "teleport"}]}`), "bad.json")
	want := "bad.json: not a valid scenario (" + schemaPath() + "):\n" +
		"  step 0 (restartBroker): missing property 'broker'\n" +
		"  step 1 (teleport) do: value must be one of 'enqueue', 'produce', "
	if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "top level: additional properties 'extra' not allowed") {
		t.Errorf("error %v, want it to start %q and name the top-level field", err, want)
	}
}

func TestScenarioLoaderFillsInTheSchemasDefaults(t *testing.T) {
	sc, steps, err := parseScenario([]byte(`{"name": "x", "steps": [
		{"do": "stats", "expect": {"ready": 0}},
		{"do": "awaitLeaseLapse", "broker": 0},
		{"do": "startWorker", "name": "w", "handler": "ack", "subscription": "s"}
	]}`), "ok.json")
	if err != nil {
		t.Fatal(err)
	}
	if sc.Brokers != 1 || sc.Queue.Shards != 1 || sc.Queue.LeaseTTLMs != 2000 || sc.Queue.BackoffMs != 100 || sc.Queue.MaxAttempts != nil {
		t.Errorf("top-level defaults: brokers %d, queue %+v", sc.Brokers, sc.Queue)
	}
	if s := steps[0].value.(*statsStep); s.Subscription != "default" || s.TimeoutMs != 10000 {
		t.Errorf("stats defaults: %+v", s)
	}
	if s := steps[1].value.(*awaitLeaseLapseStep); s.TimeoutMs != 20000 {
		t.Errorf("awaitLeaseLapse defaults: %+v", s)
	}
	if s := steps[2].value.(*startWorkerStep); s.Subscription != "s" || s.Concurrency != 1 || s.HandlerMs != 0 || s.Prefetch != 0 {
		t.Errorf("startWorker defaults: %+v", s)
	}
}
