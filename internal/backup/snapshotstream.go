package backup

import (
	"context"
	"errors"
	"fmt"
	"io"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// openSnapshot opens etcd's Snapshot stream on c and returns its reader
// and the storage version etcd sends with it (empty before etcd 3.6).
//
// clientv3's own Snapshot decodes each 32 KiB message into a new slice,
// a GiB of garbage for each GiB of database, and hands it on through a
// pipe, another goroutine. Under the agent's soft memory limit that
// garbage keeps the collector running for the whole backup. Here each
// message is read into a frame that holds gRPC's receive buffer until
// the chunk is read, and the buffer then goes back to gRPC's pool.
func openSnapshot(ctx context.Context, c *clientv3.Client) (io.ReadCloser, string, error) {
	ctx, cancel := context.WithCancel(ctx)
	cs, err := c.ActiveConnection().NewStream(ctx, &pb.Maintenance_ServiceDesc.Streams[0], pb.Maintenance_Snapshot_FullMethodName,
		grpc.ForceCodecV2(frameCodec{encoding.GetCodecV2(proto.Name)}), grpc.WaitForReady(true))
	if err == nil {
		err = cs.SendMsg(&pb.SnapshotRequest{})
	}
	if err == nil {
		err = cs.CloseSend()
	}
	if err != nil {
		err = clientv3.ContextError(ctx, err) // before cancel, which would mask the server's own deadline
		cancel()
		return nil, "", err
	}
	r := &snapshotReader{cs: cs, cancel: cancel}
	// The first message carries the version, as clientv3 reads it.
	if err := r.next(); err != nil {
		cancel()
		if errors.Is(err, io.EOF) {
			return nil, "", errors.New("the snapshot stream ended before its first message")
		}
		return nil, "", err
	}
	return r, r.version, nil
}

// snapshotReader reads the chunks of a Snapshot stream in order.
type snapshotReader struct {
	cs      grpc.ClientStream
	cancel  context.CancelFunc
	frame   snapshotFrame
	rest    []byte // what is left of frame's chunk
	version string
	err     error
}

// next receives the next frame, releasing the one before.
func (r *snapshotReader) next() error {
	r.frame.release()
	r.rest = nil
	if r.err != nil {
		return r.err
	}
	if err := r.cs.RecvMsg(&r.frame); err != nil {
		if !errors.Is(err, io.EOF) {
			err = clientv3.ContextError(r.cs.Context(), err)
		}
		r.err = err
		return err
	}
	r.rest = r.frame.blob
	if r.version == "" {
		r.version = string(r.frame.version)
	}
	return nil
}

func (r *snapshotReader) Read(p []byte) (int, error) {
	for len(r.rest) == 0 {
		if err := r.next(); err != nil {
			return 0, err
		}
	}
	n := copy(p, r.rest)
	r.rest = r.rest[n:]
	if len(r.rest) == 0 {
		r.frame.release()
	}
	return n, nil
}

// Close ends the stream. It may be called while a Read waits, from
// another goroutine: it only cancels, and a frame still held is left to
// the garbage collector.
func (r *snapshotReader) Close() error {
	r.cancel()
	return nil
}

// snapshotFrame is one SnapshotResponse: its chunk and version point
// into buf.
type snapshotFrame struct {
	buf           mem.Buffer
	blob, version []byte
}

func (f *snapshotFrame) release() {
	if f.buf != nil {
		f.buf.Free()
	}
	*f = snapshotFrame{}
}

// The fields of etcdserverpb.SnapshotResponse that a backup reads.
const (
	snapshotBlobField    = 3
	snapshotVersionField = 4
)

// decode reads a SnapshotResponse's wire form: the chunk (blob) and the
// storage version. The header and the remaining byte count are skipped.
// Both point into b.
func (f *snapshotFrame) decode(b []byte) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("backup: snapshot message: %w", protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case (num == snapshotBlobField || num == snapshotVersionField) && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return fmt.Errorf("backup: snapshot message: field %d: %w", num, protowire.ParseError(n))
			}
			if num == snapshotBlobField {
				f.blob = v
			} else {
				f.version = v
			}
			b = b[n:]
		case num == snapshotBlobField || num == snapshotVersionField:
			return fmt.Errorf("backup: snapshot message: field %d has wire type %d, want bytes", num, typ)
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return fmt.Errorf("backup: snapshot message: field %d: %w", num, protowire.ParseError(n))
			}
			b = b[n:]
		}
	}
	return nil
}

// frameCodec is gRPC's proto codec, but it reads a snapshotFrame
// without copying its chunk.
type frameCodec struct{ encoding.CodecV2 }

func (c frameCodec) Unmarshal(data mem.BufferSlice, v any) error {
	f, ok := v.(*snapshotFrame)
	if !ok {
		return c.CodecV2.Unmarshal(data, v)
	}
	// gRPC reads HTTP/2 frames of up to 16 KiB, so a 32 KiB chunk comes
	// in several buffers: they are copied into one from the process's
	// pool (its 64 KiB tier, see etcdproc). A message in one buffer gains
	// a reference instead. Either way the frame owns what it holds, and
	// gRPC frees data after this returns.
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	var g snapshotFrame
	if err := g.decode(buf.ReadOnlyData()); err != nil {
		buf.Free()
		return err
	}
	g.buf = buf
	*f = g
	return nil
}
