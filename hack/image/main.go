// Command image builds the project's container image tarball (make
// image): the agent, the ctl and the operator in /usr/local/bin, every statically
// linked etcd the tools built in /opt/etcd-v<version>, and the machine's
// CA bundle, tagged etcd-manager:dev unless IMAGE_TAG says otherwise.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/image"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run() error {
	tag := flag.String("tag", envOr("IMAGE_TAG", "etcd-manager:dev"), "the image's tag (default from IMAGE_TAG)")
	output := flag.String("output", "bin/etcd-manager-image.tar", "the image tarball to write")
	binDir := flag.String("bin-dir", "bin/image", "where the statically linked etcd-manager binaries are")
	binaries := flag.String("binaries", "etcd-manager,etcd-manager-ctl,etcd-manager-operator", "the binaries of -bin-dir to put in "+image.BinDir)
	etcdDir := flag.String("etcd-dir", "bin", "where make tools put the etcd builds (etcd-v<version>/)")
	etcdVersions := flag.String("etcd-versions", "", "the etcd versions to put in, comma or space separated, each of which must be built statically (default: every static build in -etcd-dir)")
	caCerts := flag.String("ca-certs", image.CACertsPath, "the CA bundle to copy in, for https:// stores")
	defEpoch, err := envEpoch()
	if err != nil {
		return err
	}
	epoch := flag.Int64("epoch", defEpoch, "the time stamped on every entry and the config, in seconds since 1970 (default from SOURCE_DATE_EPOCH, else 0)")
	flag.Parse()
	start := time.Now()

	found, versions, skipped, err := image.FindEtcds(*etcdDir)
	if err != nil {
		return err
	}
	var files []image.File
	if want := strings.FieldsFunc(*etcdVersions, func(r rune) bool { return r == ',' || r == ' ' }); len(want) > 0 {
		for _, v := range want {
			if !slices.Contains(versions, v) {
				return fmt.Errorf("image: etcd %s is not built statically under %s (found %s; run make etcd)", v, *etcdDir, strings.Join(versions, ", "))
			}
		}
		for _, f := range found {
			if slices.ContainsFunc(want, func(v string) bool { return strings.HasPrefix(f.Path, image.EtcdDir(v)+"/") }) {
				files = append(files, f)
			}
		}
		slices.Sort(want)
		versions = want
	} else {
		files = found
	}
	for _, b := range strings.Split(*binaries, ",") {
		src := filepath.Join(*binDir, b)
		static, err := image.Static(src)
		switch {
		case err != nil:
			return err
		case !static:
			return fmt.Errorf("image: %s is dynamically linked and would not run in the image; build it with CGO_ENABLED=0", src)
		}
		files = append(files, image.File{Path: image.BinDir + "/" + b, Source: src, Mode: 0o755})
	}
	if _, err := os.Stat(*caCerts); errors.Is(err, os.ErrNotExist) {
		// Without one the agent cannot reach an https:// store.
		return fmt.Errorf("image: no CA bundle at %s (install Debian's ca-certificates, or name one with -ca-certs)", *caCerts)
	}
	files = append(files, image.File{Path: image.CACertsPath, Source: *caCerts, Mode: 0o644})

	tmp, err := os.MkdirTemp(filepath.Dir(*output), ".image-")
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	defer os.RemoveAll(tmp)
	// The operator, run from this image, reads which etcd versions its
	// member pods can run from this file, as the label says.
	vf := filepath.Join(tmp, "etcd-versions")
	if err := os.WriteFile(vf, []byte(strings.Join(versions, ",")+"\n"), 0o644); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	files = append(files, image.File{Path: image.VersionsFile, Source: vf, Mode: 0o644})
	img, err := image.Build(image.Image{
		Files:      files,
		Entrypoint: []string{image.BinDir + "/etcd-manager"},
		Env:        []string{"PATH=" + image.BinDir + ":/usr/bin:/bin"},
		Labels:     map[string]string{image.LabelEtcdVersions: strings.Join(versions, ",")},
		User:       image.User,
		Epoch:      time.Unix(*epoch, 0),
	}, tmp)
	if err != nil {
		return err
	}
	if err := image.Write(*output, *tag, img); err != nil {
		return err
	}
	id, err := img.ConfigName()
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	st, err := os.Stat(*output)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	// The image ID (the config's digest) is what every runtime shows
	// after loading it; each computes its own manifest.
	fmt.Printf("wrote %s: %s, image ID %s, %.0f MiB, etcd %s, in %s\n", *output, *tag, id,
		float64(st.Size())/(1<<20), strings.Join(versions, ", "), time.Since(start).Round(100*time.Millisecond))
	if len(skipped) > 0 {
		fmt.Printf("left out etcd %s: the image has no C library\n", strings.Join(skipped, ", "))
	}
	return nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// envEpoch is SOURCE_DATE_EPOCH, or 0 when it is not set.
func envEpoch() (int64, error) {
	v := os.Getenv("SOURCE_DATE_EPOCH")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("image: SOURCE_DATE_EPOCH=%q is not a number of seconds since 1970", v)
	}
	return n, nil
}
