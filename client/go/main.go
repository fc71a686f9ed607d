// Command ferry-client submits a training job to ferryd, watches it to the end
// and prints where its model data lived.
//
// The watch survives a lost connection: it resumes after the last event it
// got, or, when the daemon no longer has that event, starts again from a
// snapshot. Exit codes: 0 the job succeeded, 1 it failed or was cancelled,
// 2 bad usage or a refused request, 3 the daemon could not be reached.
package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
	"unicode"

	ferryv1 "github.com/ferry-train/ferry/gen/go/ferry/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

func main() { os.Exit(run()) }

func run() int {
	address := flag.String("address", envOr("FERRY_ADDRESS", "127.0.0.1:50051"), "ferryd's address (default: $FERRY_ADDRESS or 127.0.0.1:50051)")
	token := flag.String("token", os.Getenv("FERRY_TOKEN"), "sent as 'authorization: Bearer TOKEN' (default: $FERRY_TOKEN)")
	tlsCA := flag.String("tls-ca", os.Getenv("FERRY_TLS_CA"), "talk TLS, trusting this CA (PEM) for ferryd's certificate (default: $FERRY_TLS_CA; plaintext when no --tls-* is given)")
	tlsCert := flag.String("tls-cert", os.Getenv("FERRY_TLS_CERT"), "client certificate (PEM), for a ferryd that requires one (default: $FERRY_TLS_CERT)")
	tlsKey := flag.String("tls-key", os.Getenv("FERRY_TLS_KEY"), "the client certificate's key (default: $FERRY_TLS_KEY)")
	name := flag.String("name", "go-example", "the job's name")
	preset := flag.String("preset", "", "model.preset, e.g. gpt2-tiny")
	layers := flag.Uint("layers", 0, "model.layers")
	steps := flag.Uint64("steps", 0, "train.steps")
	batchSize := flag.Uint("batch-size", 0, "train.batch_size")
	data := flag.String("data", "", "a token file (data.path); default: synthetic data")
	checkpointDir := flag.String("checkpoint-dir", "", "checkpoint.dir")
	reconnect := flag.Duration("reconnect", 2*time.Minute, "how long to keep reconnecting a lost watch")
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintf(os.Stderr, "ferry-client: unexpected argument %q; the job is given by flags\n", flag.Arg(0))
		return 2
	}

	spec := &ferryv1.JobSpec{
		Name:  *name,
		Model: &ferryv1.ModelSpec{Preset: *preset, Layers: uint32(*layers)},
		Train: &ferryv1.TrainSpec{Steps: *steps, BatchSize: uint32(*batchSize)},
		Data:  &ferryv1.DataSpec{Source: &ferryv1.DataSpec_Synthetic{Synthetic: &ferryv1.SyntheticData{}}},
	}
	if *data != "" {
		path, err := filepath.Abs(*data)
		if err != nil {
			fmt.Fprintf(os.Stderr, "ferry-client: --data: %v\n", err)
			return 2
		}
		spec.Data.Source = &ferryv1.DataSpec_Path{Path: path}
	}
	if *checkpointDir != "" {
		dir, err := filepath.Abs(*checkpointDir)
		if err != nil {
			fmt.Fprintf(os.Stderr, "ferry-client: --checkpoint-dir: %v\n", err)
			return 2
		}
		spec.Checkpoint = &ferryv1.CheckpointSpec{Dir: dir}
	}

	ctx := context.Background()
	if *token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+*token)
	}
	// Retry a lost connection at least every 2 s (gRPC's default backs off to 2 minutes).
	backoffConfig := backoff.DefaultConfig
	backoffConfig.MaxDelay = 2 * time.Second
	transport := grpc.WithInsecure()
	if *tlsCA != "" || *tlsCert != "" || *tlsKey != "" {
		creds, err := tlsCredentials(*tlsCA, *tlsCert, *tlsKey)
		if err != nil {
			fmt.Fprintf(os.Stderr, "ferry-client: %v\n", err)
			return 2
		}
		transport = grpc.WithTransportCredentials(creds)
	}
	conn, err := grpc.Dial(*address, transport, grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoffConfig, MinConnectTimeout: 20 * time.Second}))
	if err != nil {
		return fail("connect to "+*address, err)
	}
	defer conn.Close()
	client := ferryv1.NewFerryClient(conn)

	job, err := submit(ctx, client, spec)
	if err != nil {
		return fail("submit", err)
	}
	fmt.Printf("submitted %s to %s\n", job.Id, *address)
	if err := watch(ctx, client, job.Id, *reconnect); err != nil {
		return fail("watch "+job.Id, err)
	}
	if job, err = client.GetJob(ctx, &ferryv1.GetJobRequest{JobId: job.Id}); err != nil {
		return fail("get "+job.Id, err)
	}
	summary := fmt.Sprintf("%s %s at step %d, loss %.4f -> %.4f", job.Id, stateName(job.State),
		job.GetProgress().GetStep(), job.GetInitialLoss(), job.GetProgress().GetLoss())
	if job.Error != "" {
		summary += ": " + job.Error
	}
	fmt.Println(summary)
	placement, err := client.GetMemoryPlacement(ctx, &ferryv1.GetMemoryPlacementRequest{JobId: job.Id})
	switch {
	case status.Code(err) == codes.FailedPrecondition: // no step, no placement
		fmt.Printf("no memory placement: %s\n", status.Convert(err).Message())
	case err != nil:
		return fail("memory placement of "+job.Id, err)
	default:
		printPlacement(placement)
	}
	if job.State != ferryv1.JobState_JOB_STATE_SUCCEEDED {
		return 1
	}
	return 0
}

// tlsCredentials trusts the CA in caFile (else the system's) and presents
// the client certificate when one is given, as the ferry CLI does.
func tlsCredentials(caFile, certFile, keyFile string) (credentials.TransportCredentials, error) {
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("--tls-cert and --tls-key go together (a client certificate and its key)")
	}
	config := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca=%s: no PEM certificate in it", caFile)
		}
		config.RootCAs = pool
	}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert=%s --tls-key=%s: %w", certFile, keyFile, err)
		}
		config.Certificates = []tls.Certificate{pair}
	}
	return credentials.NewTLS(config), nil
}

// fail prints err and returns the exit code for it.
func fail(what string, err error) int {
	s := status.Convert(err)
	fmt.Fprintf(os.Stderr, "ferry-client: %s: %s: %s\n", what, codeName(s.Code()), s.Message())
	if s.Code() == codes.Unavailable || s.Code() == codes.DeadlineExceeded {
		return 3
	}
	return 2
}

// submit sends the job, retrying while the daemon is unavailable; the
// request_id makes a retry safe.
func submit(ctx context.Context, client ferryv1.FerryClient, spec *ferryv1.JobSpec) (*ferryv1.Job, error) {
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return nil, err
	}
	request := &ferryv1.SubmitJobRequest{Spec: spec, RequestId: hex.EncodeToString(id)}
	for attempt := 1; ; attempt++ {
		callCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		job, err := client.SubmitJob(callCtx, request)
		cancel()
		if status.Code(err) != codes.Unavailable || attempt == 5 {
			return job, err
		}
		time.Sleep(time.Second)
	}
}

// watch prints the job's events until it ends, reconnecting as needed.
func watch(ctx context.Context, client ferryv1.FerryClient, jobID string, reconnect time.Duration) error {
	var lastSeq uint64 // the newest event printed; 0: none yet, start from a snapshot
	var lostSince time.Time
	for {
		after := lastSeq
		err := func() error {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			stream, err := client.WatchJob(ctx, &ferryv1.WatchJobRequest{JobId: jobID, AfterSeq: after})
			if err != nil {
				return err
			}
			for {
				event, err := stream.Recv()
				if errors.Is(err, io.EOF) {
					return nil // the stream ends OK once the job has ended
				}
				if err != nil {
					return err
				}
				lostSince = time.Time{}
				switch kind := event.Kind.(type) {
				case *ferryv1.JobEvent_Snapshot:
					fmt.Printf("watching %s: %s, step %d (snapshot at seq %d, after seq %d)\n", kind.Snapshot.Id,
						stateName(kind.Snapshot.State), kind.Snapshot.GetProgress().GetStep(), event.Seq, after)
					if after == 0 { // the stream goes on after the snapshot's seq
						lastSeq = event.Seq
					}
				case *ferryv1.JobEvent_Heartbeat:
				default:
					if event.Seq != lastSeq+1 {
						fmt.Fprintf(os.Stderr, "warning: gap in the events: seq %d then %d\n", lastSeq, event.Seq)
					}
					lastSeq = event.Seq
					printEvent(event)
				}
			}
		}()
		switch status.Code(err) {
		case codes.OK:
			return nil
		case codes.OutOfRange:
			fmt.Printf("events after seq %d are gone (%s); starting again from a fresh snapshot\n",
				lastSeq, status.Convert(err).Message())
			lastSeq = 0
		case codes.Unavailable:
			if lostSince.IsZero() {
				lostSince = time.Now()
				fmt.Printf("stream lost (%s); reconnecting after seq %d\n", status.Convert(err).Message(), lastSeq)
			} else if time.Since(lostSince) > reconnect {
				return status.Errorf(codes.Unavailable, "gave up reconnecting after %v: %s", reconnect, status.Convert(err).Message())
			}
			time.Sleep(500 * time.Millisecond)
		default:
			return err
		}
	}
}

// codeName spells a status code as words: "invalid argument".
func codeName(c codes.Code) string {
	var b strings.Builder
	for i, r := range c.String() {
		if i > 0 && unicode.IsUpper(r) {
			b.WriteByte(' ')
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

func stateName(s ferryv1.JobState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "JOB_STATE_"))
}

func mib(bytes uint64) float64 { return float64(bytes) / (1 << 20) }

func printEvent(event *ferryv1.JobEvent) {
	switch kind := event.Kind.(type) {
	case *ferryv1.JobEvent_Progress:
		p := kind.Progress
		fmt.Printf("step %d/%d  loss %.4f  %.0f tok/s  device %.1f MiB  (seq %d)\n",
			p.Step, p.TotalSteps, p.Loss, p.TokensPerSecond, mib(p.DeviceMemoryBytes), event.Seq)
	case *ferryv1.JobEvent_StateChange:
		c := kind.StateChange
		reason := ""
		if c.Reason != "" {
			reason = ": " + c.Reason
		}
		fmt.Printf("%s -> %s%s  (seq %d)\n", stateName(c.From), stateName(c.To), reason, event.Seq)
	case *ferryv1.JobEvent_Log:
		fmt.Printf("log: %s\n", kind.Log.Message)
	}
}

func printPlacement(p *ferryv1.MemoryPlacement) {
	fmt.Printf("memory placement of %s at step %d: %s policy on %s, %s\n", p.JobId, p.Step, p.Policy, p.Device, p.Phase)
	fmt.Printf("  device capacity %.1f MiB, limit %.1f MiB, chunks of %.2f MiB, planned traffic %.2f MiB/step\n",
		mib(p.DeviceCapacityBytes), mib(p.DeviceLimitBytes), mib(p.ChunkSizeBytes), mib(p.PlannedTrafficBytes))
	for _, t := range p.Totals {
		fmt.Printf("  %-6s %-10s %10.2f MiB\n", t.Tier, t.Kind, mib(t.Bytes))
	}
	tiers := map[string]int{}
	for _, c := range p.Chunks {
		tiers[c.Tier]++
	}
	names := make([]string, 0, len(tiers))
	for t := range tiers {
		names = append(names, fmt.Sprintf("%s %d", t, tiers[t]))
	}
	sort.Strings(names)
	fmt.Printf("  chunk payloads by tier: %s\n", strings.Join(names, ", "))
}
