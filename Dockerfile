# hwipam image: the binaries at the paths NicClusterPolicy's nvIpam expects
# (/ipam-controller, /ipam-node, /nv-ipam) plus /ipamctl. Binaries that do not exist
# yet in this tree are simply absent.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN make build VERSION=${VERSION}

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /src/bin/ /
USER 65532:65532
