# Builds the exit-guard image: a static binary on no base image, running as non-root. The same
# image builds without a container engine: `make image` (hack/image). hack/image's tests fail
# when a file the binary is built from is not copied below.
FROM golang:1.26 AS build
WORKDIR /src
# Dependencies in their own layer, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY *.go ./
COPY completionstore/ completionstore/
COPY contract/ contract/
COPY internal/ internal/
COPY webhook/ webhook/
ARG TARGETOS=linux
ARG TARGETARCH=amd64
# What exit-guard --version prints: docker build --build-arg VERSION=... --build-arg COMMIT=...
ARG VERSION=dev
ARG COMMIT=unknown
ARG BUILD_DATE=unknown
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath \
      -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT} -X main.date=${BUILD_DATE}" -o /exit-guard .

FROM scratch
COPY --from=build /exit-guard /exit-guard
# The restricted Pod Security profile's non-root user (distroless' nonroot).
USER 65532:65532
ENTRYPOINT ["/exit-guard"]
