package backup

import (
	"bytes"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	protobuf "google.golang.org/protobuf/proto"
)

// A frame reads what etcd sends, in any field order and with fields it
// does not know, and refuses what is not a SnapshotResponse.
func TestSnapshotFrameDecode(t *testing.T) {
	full, err := protobuf.Marshal(&pb.SnapshotResponse{
		Header: &pb.ResponseHeader{ClusterId: 7, Revision: 9}, RemainingBytes: 5, Blob: []byte("chunk"), Version: "3.6.0",
	})
	if err != nil {
		t.Fatal(err)
	}
	unknown := protowire.AppendTag(nil, 9, protowire.Fixed64Type)
	unknown = protowire.AppendFixed64(unknown, 1)
	reversed := protowire.AppendTag(nil, snapshotVersionField, protowire.BytesType)
	reversed = protowire.AppendString(reversed, "3.7.0")
	reversed = protowire.AppendTag(reversed, snapshotBlobField, protowire.BytesType)
	reversed = protowire.AppendBytes(reversed, []byte("x"))
	wrongType := protowire.AppendTag(nil, snapshotBlobField, protowire.VarintType)
	wrongType = protowire.AppendVarint(wrongType, 1)
	cases := []struct {
		name          string
		in            []byte
		blob, version string
		err           string
	}{
		{name: "etcd's", in: full, blob: "chunk", version: "3.6.0"},
		{name: "empty message", in: nil},
		{name: "unknown field", in: append(append([]byte{}, unknown...), full...), blob: "chunk", version: "3.6.0"},
		{name: "reversed", in: reversed, blob: "x", version: "3.7.0"},
		{name: "wrong wire type", in: wrongType, err: "field 3 has wire type 0"},
		{name: "truncated chunk", in: full[:len(full)-8], err: "snapshot message"},
		{name: "bad tag", in: []byte{0x80}, err: "snapshot message"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var f snapshotFrame
			err := f.decode(c.in)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("decode = %v, want an error with %q", err, c.err)
				}
				return
			}
			if err != nil || string(f.blob) != c.blob || string(f.version) != c.version {
				t.Fatalf("decode = %q, %q, %v; want %q, %q", f.blob, f.version, err, c.blob, c.version)
			}
		})
	}
}

// The codec's frame keeps gRPC's buffer alive after gRPC frees its own
// reference, and gives it back when released; a message that came in
// several buffers is read as one.
func TestFrameCodecHoldsTheBuffer(t *testing.T) {
	msg, err := protobuf.Marshal(&pb.SnapshotResponse{Blob: bytes.Repeat([]byte("ab"), 3000), Version: "3.6.0"})
	if err != nil {
		t.Fatal(err)
	}
	codec := frameCodec{encoding.GetCodecV2(proto.Name)}
	for _, split := range []int{0, 100} {
		var data mem.BufferSlice
		freed := 0
		for _, part := range [][]byte{msg[:split], msg[split:]} {
			if len(part) > 0 {
				data = append(data, mem.NewBuffer(&part, recordingPool{freed: &freed}))
			}
		}
		var f snapshotFrame
		if err := codec.Unmarshal(data, &f); err != nil {
			t.Fatal(err)
		}
		data.Free() // as gRPC does once Unmarshal returns
		if !bytes.Equal(f.blob, bytes.Repeat([]byte("ab"), 3000)) || string(f.version) != "3.6.0" {
			t.Fatalf("split %d: the frame's chunk or version differ", split)
		}
		if split == 0 && freed != 0 {
			t.Fatalf("gRPC's buffer went back to its pool while the frame held it")
		}
		f.release()
		if freed != len(data) {
			t.Fatalf("split %d: %d of %d buffers back in the pool", split, freed, len(data))
		}
	}
	// Other messages (the request) go through the proto codec.
	var req pb.SnapshotRequest
	if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(nil)}, &req); err != nil {
		t.Fatal(err)
	}
}

// recordingPool counts the buffers given back to it.
type recordingPool struct{ freed *int }

func (p recordingPool) Get(n int) *[]byte { b := make([]byte, n); return &b }
func (p recordingPool) Put(*[]byte)       { *p.freed++ }
