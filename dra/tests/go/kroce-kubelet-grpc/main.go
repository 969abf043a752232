// Command kroce-kubelet-grpc calls a kroce plugin socket the way the kubelet
// does, with the kubelet's own gRPC library (grpc-go, built in GOPATH mode
// from Debian's golang-google-grpc-dev): grpc.DialContext with the bare
// socket path as the target, a unix dialer and no authority override, as
// the kubelet's plugin watcher dials a registration socket
// (pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go). So
// grpc-go sends the percent-encoded path as :authority.
//
//	kroce-kubelet-grpc register SOCKET      GetInfo, then NotifyRegistrationStatus(true)
//	kroce-kubelet-grpc deviceplugin SOCKET  v1beta1.DevicePlugin/GetDevicePluginOptions
//
// Messages are encoded by hand (protowire) from the kubelet's field numbers:
// the kubelet's generated API packages are not in Debian.
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// raw carries already-encoded protobuf bytes. Registered as "proto", the
// codec grpc-go uses by default, so the request's content-type is plain
// application/grpc as the kubelet's.
type raw struct{}

func (raw) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (raw) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (raw) Name() string { return "proto" }

func dial(path string) (*grpc.ClientConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return grpc.DialContext(ctx, path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}))
}

func call(conn *grpc.ClientConn, method string, req []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var resp []byte
	err := conn.Invoke(ctx, method, &req, &resp)
	return resp, err
}

// strings of a message by field number (PluginInfo: 1 type, 2 name,
// 3 endpoint, 4 supported_versions).
func fields(b []byte) (map[protowire.Number][]string, error) {
	out := map[protowire.Number][]string{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		if typ == protowire.BytesType {
			s, m := protowire.ConsumeString(b)
			if m < 0 {
				return nil, protowire.ParseError(m)
			}
			out[num] = append(out[num], s)
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return nil, protowire.ParseError(m)
		}
		b = b[m:]
	}
	return out, nil
}

func register(conn *grpc.ClientConn) error {
	resp, err := call(conn, "/pluginregistration.Registration/GetInfo", nil)
	if err != nil {
		return fmt.Errorf("GetInfo: %w", err)
	}
	info, err := fields(resp)
	if err != nil {
		return fmt.Errorf("GetInfo answer: %w", err)
	}
	fmt.Printf("type=%s name=%s endpoint=%s versions=%s\n",
		strings.Join(info[1], ","), strings.Join(info[2], ","),
		strings.Join(info[3], ","), strings.Join(info[4], ","))
	// RegistrationStatus{plugin_registered: true (1), error: "" (2, omitted)}.
	var status []byte
	status = protowire.AppendTag(status, 1, protowire.VarintType)
	status = protowire.AppendVarint(status, 1)
	if _, err := call(conn, "/pluginregistration.Registration/NotifyRegistrationStatus", status); err != nil {
		return fmt.Errorf("NotifyRegistrationStatus: %w", err)
	}
	fmt.Println("notified")
	return nil
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: kroce-kubelet-grpc register|deviceplugin SOCKET")
		os.Exit(2)
	}
	encoding.RegisterCodecV2(raw{})
	conn, err := dial(os.Args[2])
	if err != nil {
		fmt.Fprintf(os.Stderr, "dial %s: %v\n", os.Args[2], err)
		os.Exit(1)
	}
	defer conn.Close()
	switch os.Args[1] {
	case "register":
		err = register(conn)
	case "deviceplugin":
		_, err = call(conn, "/v1beta1.DevicePlugin/GetDevicePluginOptions", nil)
		if err == nil {
			fmt.Println("options ok")
		}
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
